"""A redis-server of the test's own, on a free loopback port, persisting every write to disk.

For tests that kill Redis and start it again: ``--appendonly yes --appendfsync always``, so a
write Redis acknowledged survives a SIGKILL, and a restart on the same port and directory loads
it back; or ``fsync="everysec"`` (Redis's default), which may lose its last second of writes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.support.waiting import wait_for


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class OwnRedis:
    """A redis-server this test started, on a free loopback port, persisting to ``dir``."""

    dir: Path
    port: int = field(default_factory=free_port)
    fsync: str = "always"  # appendfsync: always, everysec
    args: tuple[str, ...] = ()  # more of redis-server's options (``--replicaof`` ...)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it (again: on the same port and directory, loading what it persisted)."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (make test installs it)")
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        args += ["--appendonly", "yes", "--appendfsync", self.fsync, "--save", ""]
        args += ["--logfile", str(self.dir / "redis.log"), *self.args]
        self.proc = subprocess.Popen([binary, *args])
        probe = redis.Redis.from_url(self.url, socket_timeout=1)
        proc = self.proc

        def up() -> bool:
            assert proc.poll() is None, "redis-server exited on start"
            try:
                return bool(probe.ping())
            except redis.ConnectionError:  # includes BusyLoadingError
                return False

        try:  # start and AOF load
            wait_for(up, 10, f"redis-server on port {self.port} to come up", every_s=0.025)
        finally:
            probe.close()

    def kill(self) -> None:
        """SIGKILL it, by PID, and reap it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        """End it if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
