"""A Sentinel-managed Redis of the test's own: a master, its replica and three Sentinels.

Every process is a ``redis-server`` on a free loopback port, with its own directory under the
group's (a Sentinel rewrites its config file: each has its own). The Sentinels agree with a
quorum of 2, call a master down after 1 s without an answer, and may fail over again 5 s
later. :meth:`SentinelGroup.stop` ends, by PID, only the processes the group started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from ops.local.cluster import free_ports
from tests.support.redis_server import OwnRedis
from tests.support.waiting import wait_for

SERVICE = "reins-test"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000


def _answer(port: int, ask: Callable[[redis.Redis], Any]) -> Any:
    """What ``ask`` gets from the server on ``port``, or None when it does not answer."""
    try:
        with redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1) as probe:
            return ask(probe)
    except redis.ConnectionError:  # refused, reset, or loading
        return None


def role(port: int) -> str | None:
    """``master`` or ``slave``, as ``INFO replication`` of the server on ``port`` says."""
    info = _answer(port, lambda r: r.info("replication"))
    return None if info is None else str(info["role"])


@dataclass
class SentinelGroup:
    """A master, a replica of it and three Sentinels watching it, all under ``dir``."""

    dir: Path
    master: OwnRedis = field(init=False)
    replica: OwnRedis = field(init=False)
    sentinel_ports: list[int] = field(default_factory=lambda: free_ports(3))
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("master", "replica", "s0", "s1", "s2"):
            (self.dir / name).mkdir(parents=True)
        self.master = OwnRedis(self.dir / "master")
        self.replica = OwnRedis(
            self.dir / "replica", args=("--replicaof", "127.0.0.1", str(self.master.port))
        )

    @property
    def url(self) -> str:
        """The store's ``redis+sentinel://`` URL, naming all three Sentinels."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        """Start every process; return once each Sentinel knows the replica and its two
        peers, and the replica is in sync."""
        self.master.start()
        self.replica.start()
        binary = shutil.which("redis-server")
        assert binary is not None
        for i, port in enumerate(self.sentinel_ports):
            home = self.dir / f"s{i}"
            conf = home / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {home}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            log = home / "sentinel.log"
            self.sentinels.append(
                subprocess.Popen([binary, str(conf), "--sentinel", "--logfile", str(log)])
            )
        wait_for(self._watching, 60, "three Sentinels to know the replica and each other")

    def _watching(self) -> bool:
        for proc in self.sentinels:
            assert proc.poll() is None, f"a Sentinel exited with {proc.returncode}"
        synced = _answer(self.replica.port, lambda r: r.info("replication"))
        if synced is None or synced.get("master_link_status") != "up":
            return False
        for port in self.sentinel_ports:
            state = _answer(port, lambda r: r.sentinel_master(SERVICE))
            if state is None:
                return False
            if int(state["num-slaves"]) < 1 or int(state["num-other-sentinels"]) < 2:
                return False
        return True

    def named_master(self) -> set[int | None]:
        """The master's port as each Sentinel names it (None: one that does not answer)."""
        named: set[int | None] = set()
        for port in self.sentinel_ports:
            found = _answer(port, lambda r: r.sentinel_get_master_addr_by_name(SERVICE))
            named.add(int(found[1]) if found else None)
        return named

    def fail_over(self) -> None:
        """``SENTINEL FAILOVER``, sent to the first Sentinel: the replica is promoted."""
        assert _answer(self.sentinel_ports[0], lambda r: r.sentinel_failover(SERVICE)) is not None

    def wait_promoted(self, timeout_s: float) -> None:
        """Until every Sentinel names the replica the master and it says it is one."""

        def promoted() -> bool:
            named = self.named_master() == {self.replica.port}
            return named and role(self.replica.port) == "master"

        wait_for(promoted, timeout_s, "the Sentinels to promote the replica", every_s=0.05)

    def stop(self) -> None:
        """End every process the group started, by PID."""
        for proc in self.sentinels:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self.replica.stop()
        self.master.stop()
