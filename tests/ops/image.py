"""The image `make image` builds, and its processes run with podman as the chart runs them.

Podman runs here, with two flags this machine's sandbox needs (neither changes the image):
``--runtime runc``, because crun, podman's default, refuses the hybrid cgroup v1/v2 mounts;
and explicit ``nofile``/``nproc`` limits at or under the current ones, because podman's
defaults are higher and raising a limit needs CAP_SYS_RESOURCE, which this sandbox lacks.
Every container runs as the chart's pods do (helm/reins/values.yaml, ``securityContext``): root
file system read-only, a tmpfs at /tmp, no capabilities, no privilege escalation; as the image's
own user (the test checks it is the chart's uid 10001); on the host's network, so the test's
Redis on loopback answers.
"""

from __future__ import annotations

import re
import resource
import subprocess
from collections.abc import Mapping
from pathlib import Path

import redis

from ops.local.fleet import LocalFleet

ROOT = Path(__file__).resolve().parents[2]
#: The chart's document path (helm/reins/templates/_helpers.tpl, reins.tenantsPath).
DOCUMENT_PATH = "/etc/reins/tenants.toml"


def build() -> tuple[str, str]:
    """``make image`` in this checkout: the image's name and what the build printed."""
    done = subprocess.run(
        ["make", "-s", "image"], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, f"make image failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return image_name(), done.stdout + done.stderr


def image_name() -> str:
    """The name ``make image`` tags (``make image-name``)."""
    done = subprocess.run(
        ["make", "-s", "image-name"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def run_options() -> list[str]:
    """``podman run``'s options for every container of the tests (see the module docstring)."""
    _, nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nofile = min(nofile, 65536) if nofile != resource.RLIM_INFINITY else 65536
    return [
        "--runtime",
        "runc",
        "--ulimit",
        f"nofile={nofile}:{nofile}",
        "--ulimit",
        "nproc=4096:4096",
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
    ]


def podman_run(image: str, *args: str, options: tuple[str, ...] = ()) -> list[str]:
    """The command that runs ``reins <args>`` from ``image`` in a container removed after."""
    return ["podman", "run", "--rm", *run_options(), *options, image, *args]


def run(image: str, *args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``reins <args>`` (or another entrypoint given in ``options``) to its end."""
    cmd = podman_run(image, *args, options=options)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def env_options(env: Mapping[str, str]) -> list[str]:
    """``--env`` options carrying the fleet's ``REINS_*`` settings into a container."""
    return [f"--env={k}={v}" for k, v in sorted(env.items()) if k.startswith("REINS_")]


class ImageFleet(LocalFleet):
    """A :class:`LocalFleet` whose workers and routers run from the image: each is a
    ``podman run`` in the foreground, which passes the SIGTERM of :meth:`stop` on to the
    container's ``reins`` (PID 1 there, as in a pod) and exits with its code."""

    def __init__(
        self, image: str, settings_env: Mapping[str, str], log_dir: Path, client: redis.Redis
    ) -> None:
        super().__init__(settings_env, log_dir, client)
        self.image = image
        # Containers are named after this test's key prefix and the process, so the cleanup
        # removes exactly the ones this test started.
        self.tag = re.sub(r"[^a-zA-Z0-9_.-]", "-", self.prefix)
        self.containers: list[str] = []
        self._settings = dict(settings_env)

    def start(
        self,
        role: str,
        name: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        module: str = "ops.cli.fleet",
    ) -> None:
        if name in self.procs and self.procs[name].poll() is None:
            raise ValueError(f"{name} is already running")
        self._ended.discard(name)
        log = self._logs.get(name) or open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
        self._logs[name] = log
        container = f"{self.tag}-{name}"
        self.containers.append(container)
        options = ("--name", container, *env_options({**self._settings, **(env or {})}))
        self.procs[name] = subprocess.Popen(
            podman_run(self.image, role, "--name", name, *args, options=options),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def close(self) -> dict[str, int]:
        codes = super().close()
        for container in self.containers:  # a container whose podman client was killed
            subprocess.run(
                ["podman", "rm", "--force", "--ignore", "--time", "0", container],
                capture_output=True,
                timeout=60,
            )
        return codes
