"""A fleet as local processes: workers and routers on this machine, for the bench and the tests.

:class:`LocalFleet` starts ``python -m ops.cli.fleet worker|router`` subprocesses with an
environment of ``REINS_*`` settings it is given (nothing else of the caller's ``REINS_*``
leaks in), writes each one's output to its own log file, waits for them by polling Redis
(membership and replica reports, bounded), and ends each one by its PID: SIGTERM first, then
SIGKILL past a deadline. It never signals a process it did not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

import redis

from router.placement.membership import Membership

ROOT = Path(__file__).resolve().parents[2]


def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, every_s: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; raise TimeoutError naming ``what`` after the bound."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(every_s)


class LocalFleet:
    """Fleet processes started by this object; see the module docstring."""

    def __init__(self, settings_env: Mapping[str, str], log_dir: Path, client: redis.Redis) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
        self.env.update(settings_env)
        self.env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(ROOT), self.env.get("PYTHONPATH")])
        )
        self.prefix = settings_env["REINS_KEY_PREFIX"]
        self.log_dir = log_dir
        self.client = client
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._ended: set[str] = set()  # processes this object asked to end

    # --- starting ----------------------------------------------------------------------------

    def start(
        self,
        role: str,
        name: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        module: str = "ops.cli.fleet",
        python: str = sys.executable,
        cwd: Path = ROOT,
    ) -> None:
        """Start ``reins <role> --name <name> <args>`` as a subprocess (again, once it ended:
        a restart under the same name, as a restarted pod); ``module`` is what ``python -m``
        runs (a test's own launcher of the same commands); ``python`` and ``cwd`` another
        build's interpreter and a directory to start in (a rolling upgrade's older build)."""
        if name in self.procs and self.procs[name].poll() is None:
            raise ValueError(f"{name} is already running")
        self._ended.discard(name)
        log = self._logs.get(name) or open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
        self._logs[name] = log
        cmd = [python, "-m", module, role, "--name", name, *args]
        self.procs[name] = subprocess.Popen(
            cmd,
            cwd=cwd,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def wait_ready(self, workers: list[str], routers: list[str], timeout_s: float = 60.0) -> None:
        """Until every worker is a live member and every router has published its ring."""
        membership = Membership(self.client, self.prefix)

        def ready() -> bool:
            self._check_alive()
            live = {m.name for m in membership.live_members()}
            reports = {r.replica_id: r for r in membership.replicas() if r.live}
            return set(workers) <= live and all(
                r in reports and set(workers) <= reports[r].active for r in routers
            )

        wait_for(ready, timeout_s, f"workers {workers} and routers {routers}")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and name not in self._ended:
                raise RuntimeError(
                    f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}"
                )

    # --- ending ------------------------------------------------------------------------------

    def stop(self, name: str, timeout_s: float = 60.0) -> int:
        """SIGTERM one process and wait for it; SIGKILL it past the deadline. Its exit code."""
        proc = self.procs[name]
        self._ended.add(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return proc.returncode

    def wait_exit(self, name: str, timeout_s: float = 60.0) -> int:
        """Wait for a process that was told to stop some other way (``reins ring drain``) to
        exit by itself; SIGKILL it past the deadline. Its exit code."""
        proc = self.procs[name]
        self._ended.add(name)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise TimeoutError(f"{name} did not exit within {timeout_s:.0f}s") from None

    def kill(self, name: str) -> int:
        """SIGKILL one process (a crash) and reap it."""
        proc = self.procs[name]
        self._ended.add(name)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        return proc.returncode

    def close(self) -> dict[str, int]:
        """End every process still running (SIGTERM, then SIGKILL); their exit codes."""
        codes: dict[str, int] = {}
        for name, proc in self.procs.items():
            if proc.poll() is None:
                self._ended.add(name)
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait(timeout=10)
        for log in self._logs.values():
            log.close()
        return codes

    def cpu_s(self, *names: str) -> float:
        """CPU seconds (user + system) the named processes used so far (Linux /proc)."""
        return sum(process_cpu_s(self.procs[name].pid) for name in names)

    def log(self, name: str) -> str:
        """What the process wrote so far."""
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (Linux /proc; 0 elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
