"""A real Prometheus server for a test: own port on 127.0.0.1, generated config, tmp storage.

:class:`PrometheusServer` is a context manager. On enter it writes a config that scrapes the
given ``/metrics`` targets, starts ``prometheus`` on a free loopback port and polls until the
server is ready; on exit it ends that one process by its PID and removes its directory.
Nothing sleeps to synchronise: every wait polls a condition until a deadline.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.support import wait_for

SCRAPE_INTERVAL = "200ms"
RATE_INTERVAL = "5m"  # longer than any test's run: a panel's rates cover all of it


def expand(expr: str, tenant: str = ".*", namespace: str = ".*", job: str = ".*") -> str:
    """A dashboard query with Grafana's variables as a selection expands them (All: ``.*``)."""
    return (
        expr.replace("$__rate_interval", RATE_INTERVAL)
        .replace("$tenant", tenant)
        .replace("$namespace", namespace)
        .replace("$job", job)
    )


JOB = "reins"
POLL_S = 0.05


def find_prometheus() -> str | None:
    """The prometheus binary, or None (``make tools`` installs it)."""
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )


def free_port() -> int:
    """A port nothing listens on right now (127.0.0.1)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port`` of /metrics endpoints)."""

    def __init__(
        self,
        binary: str,
        targets: list[str],
        startup_timeout_s: float = 60,
        labels: dict[str, str] | None = None,
    ) -> None:
        self.binary, self.targets, self.startup_timeout_s = binary, targets, startup_timeout_s
        self.labels = labels or {}  # added to every target's series (a namespace, say)
        self.port = 0
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.dir = Path(tempfile.mkdtemp(prefix="reins-prometheus-"))
        config = self.dir / "prometheus.yml"
        # JSON is YAML: no YAML library needed to write the config.
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": SCRAPE_INTERVAL, "scrape_timeout": "150ms"},
                    "scrape_configs": [
                        {
                            "job_name": JOB,
                            "static_configs": [{"targets": self.targets, "labels": self.labels}],
                        }
                    ],
                }
            )
        )
        try:
            self._start(config)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, config: Path) -> None:
        assert self.dir is not None
        self.port = free_port()
        log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited early:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    return bool(r.status == 200)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        wait_for(ready, self.startup_timeout_s, "prometheus to be ready", every_s=POLL_S)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()  # SIGTERM to this PID only
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server's log, for failure messages."""
        if self.dir is None or not (self.dir / "prometheus.log").exists():
            return ""
        return "\n".join((self.dir / "prometheus.log").read_text().splitlines()[-lines:])

    # --- HTTP API -----------------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a success, else an AssertionError."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as err:
            with err:
                body = json.load(err)  # Prometheus explains a bad query in the body
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query at the server's now: the vector's samples (a scalar as one)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def last_scrape(self, targets: list[str] | None = None) -> float:
        """When the latest completed scrape of every target (or of ``targets``) began (0 if
        none yet, or one of them is down)."""
        wanted = set(self.targets if targets is None else targets)
        # timestamp() keeps a sample's own time only when applied straight to a selector
        up = [s for s in self.query(f'up{{job="{JOB}"}}') if s["metric"]["instance"] in wanted]
        if len(up) < len(wanted) or any(float(s["value"][1]) != 1 for s in up):
            return 0.0
        times = self.query(f'timestamp(up{{job="{JOB}"}})')
        return min(float(s["value"][1]) for s in times if s["metric"]["instance"] in wanted)

    def wait_scraped_after(
        self, t: float, timeout_s: float = 30, targets: list[str] | None = None
    ) -> None:
        """Wait until every target (or each of ``targets``) has been scraped by a scrape that
        began after ``t``."""
        wait_for(
            lambda: self.last_scrape(targets) > t,
            timeout_s,
            f"a scrape after {t:.3f}",
            every_s=POLL_S,
        )
