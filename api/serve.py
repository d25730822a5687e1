"""Serving the API with uvicorn until SIGTERM or SIGINT, then exiting 0 once the requests in
flight are answered (at most ``grace_s``; open event streams are cut then).

With ``workers`` above 1 the listening socket is bound once and that many processes are forked
to accept on it, each building its own application (its own Redis connections) after the fork;
the parent forwards SIGTERM and SIGINT to them and exits 0 when every one did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """uvicorn's server, whose signal handlers only ask it to stop (uvicorn's own re-raise the
    signal at exit, which would end the process with it rather than with status 0)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: Any) -> None:
            self.should_exit = True

        previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _config(app: FastAPI, log_level: str, grace_s: float, **where: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_level=log_level.lower(),
        access_log=False,
        proxy_headers=False,  # the app believes forwarded headers (REINS_TRUSTED_PROXIES) alone
        timeout_graceful_shutdown=int(grace_s),
        **where,
    )


def serve(
    make_app: Callable[[], FastAPI],
    host: str,
    port: int,
    log_level: str,
    *,
    workers: int = 1,
    grace_s: float = 5.0,
) -> int:
    """Serve the app ``make_app`` builds on ``host:port`` until told to stop; the exit status."""
    if workers <= 1:
        server = _Server(_config(make_app(), log_level, grace_s, host=host, port=port))
        server.run()
        return 0 if server.started else 1
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    children = [_fork(make_app, sock, log_level, grace_s) for _ in range(workers)]
    sock.close()
    return _supervise(children)


def _fork(
    make_app: Callable[[], FastAPI], sock: socket.socket, log_level: str, grace: float
) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        server = _Server(_config(make_app(), log_level, grace))
        server.run(sockets=[sock])
        code = 0 if server.started else 1
    finally:
        os._exit(code)


def _supervise(children: list[int]) -> int:
    """Forward stop signals to ``children``; wait for each; 0 if every one exited 0."""

    def forward(signum: int, frame: Any) -> None:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    worst = 0
    for pid in children:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, 0 if os.waitstatus_to_exitcode(status) == 0 else 1)
    return worst
