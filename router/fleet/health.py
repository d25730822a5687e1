"""The probes of a router or worker process: ``GET /livez`` and ``GET /readyz``.

Each answers 200 ``ok`` while its check returns None, and 503 with the check's reason
otherwise; any other path is 404. The server runs on a thread of its own, so a wedged loop
cannot answer for itself: the checks read what the loop last recorded (:class:`Beat`), and
a loop that stopped making progress fails its liveness probe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kernel.settings import Settings

log = logging.getLogger("reins.health")

#: A probe's check: None when healthy, else why not.
Check = Callable[[], str | None]


class Beat:
    """When a loop last went round, on the monotonic clock; read from the probes' thread."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.at = time.monotonic()

    def mark(self) -> None:
        """The loop went round now."""
        self.at = time.monotonic()

    def stale(self, within_s: float) -> str | None:
        """None when the loop went round in the last ``within_s`` seconds, else why not."""
        ago = time.monotonic() - self.at
        return None if ago <= within_s else f"{self.what} made no progress for {ago:.1f}s"


class HealthServer:
    """Serves the two probes on ``host:port`` (port 0: a free one) until :meth:`stop`."""

    def __init__(self, host: str, port: int, live: Check, ready: Check) -> None:
        checks = {"/livez": live, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                check = checks.get(self.path.split("?", 1)[0])
                if check is None:
                    self._answer(404, "no such probe: /livez or /readyz")
                    return
                try:
                    why = check()
                except Exception as exc:  # a check that fails is a failed probe
                    why = f"check failed: {exc!r}"
                self._answer(200 if why is None else 503, "ok" if why is None else why)

            def _answer(self, code: int, body: str) -> None:
                data = (body + "\n").encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds: not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="reins-health", daemon=True
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> HealthServer:
        """Start serving; returns itself."""
        self._thread.start()
        log.info("probes on port %d: /livez /readyz", self.port)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


def live_within_s(settings: Settings) -> float:
    """How long a process's loop may go without a round before its liveness probe fails."""
    return max(10.0, 10 * settings.heartbeat_interval_s)


def serve_probes(settings: Settings, live: Check, ready: Check) -> HealthServer | None:
    """The probes on ``REINS_HEALTH_HOST:REINS_HEALTH_PORT``, started; None when the port is 0."""
    if not settings.health_port:
        return None
    return HealthServer(settings.health_host, settings.health_port, live, ready).start()
