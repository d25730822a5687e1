"""Serving the API with uvicorn until SIGTERM or SIGINT, then exiting 0 once the requests in
flight are answered (at most ``grace_s``; open event streams are cut then)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI


class _Server(uvicorn.Server):
    """uvicorn's server, whose signal handlers only ask it to stop (uvicorn's own re-raise the
    signal at exit, which would end the process with it rather than with status 0)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: Any) -> None:
            self.should_exit = True

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: FastAPI, host: str, port: int, log_level: str, grace_s: float = 5.0) -> int:
    """Serve ``app`` on ``host:port`` until told to stop; the exit status."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=int(grace_s),
    )
    server = _Server(config)
    server.run()
    return 0 if server.started else 1
