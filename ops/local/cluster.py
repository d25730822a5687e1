"""A three-master Redis Cluster as local processes, on free loopback ports.

For the tests (``tests/support/redis_cluster.py``) and ``reins bench store --cluster``: each
master is a ``redis-server --cluster-enabled yes`` without persistence in a directory of its
own, the slots are spread by ``redis-cli --cluster create``, and :meth:`LocalCluster.start`
returns once every master's ``CLUSTER INFO`` says ``cluster_state:ok`` and all of them agree
on the slots. Only the processes this object started are ended, by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import redis

from ops.local.fleet import wait_for

MASTERS = 3


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody listens on now (held open together, so the
    kernel hands out different ones)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (make test installs Redis)")
    return found


@dataclass
class LocalCluster:
    """Three cluster-enabled redis-servers under ``dir``; see the module docstring."""

    dir: Path
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The cluster's URL for :func:`store.redis_client.client_from_url`."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the masters, create the cluster and wait until it serves every slot."""
        server, cli = _binary("redis-server"), _binary("redis-cli")
        both = free_ports(2 * MASTERS)  # a client port and a cluster-bus port per master
        self.ports, buses = both[:MASTERS], both[MASTERS:]
        try:
            for port, bus in zip(self.ports, buses, strict=True):
                node_dir = self.dir / str(port)
                node_dir.mkdir(parents=True, exist_ok=True)
                args = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
                args += ["--cluster-enabled", "yes", "--cluster-port", str(bus)]
                args += ["--cluster-config-file", str(node_dir / "nodes.conf")]
                args += ["--save", "", "--appendonly", "no"]
                args += ["--logfile", str(node_dir / "redis.log")]
                self.procs.append(subprocess.Popen([server, *args]))
            for port in self.ports:
                wait_for(partial(self._answers, port), timeout_s, f"redis-server on {port}")
            create = [cli, "--cluster", "create"]
            create += [f"127.0.0.1:{port}" for port in self.ports]
            create += ["--cluster-replicas", "0", "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, timeout=timeout_s, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout!r}")
            wait_for(self._ok, timeout_s, "the cluster to report cluster_state:ok", every_s=0.02)
        except BaseException:
            self.stop()
            raise

    def _answers(self, port: int) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"a redis-server of the cluster exited ({proc.returncode})")
        try:
            with redis.Redis(port=port, socket_timeout=1) as probe:
                return bool(probe.ping())
        except redis.ConnectionError:
            return False

    def _ok(self) -> bool:
        """Every master says ``cluster_state:ok`` and knows all three masters' slots."""
        for port in self.ports:
            with redis.Redis(port=port, socket_timeout=1) as probe:
                info = probe.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or "cluster_known_nodes:3" not in text:
                    return False
                if len(probe.execute_command("CLUSTER", "SLOTS")) < MASTERS:
                    return False
        return True

    def stop(self) -> None:
        """End the masters this object started (SIGKILL by PID; nothing is persisted)."""
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        self.procs = []
