"""A ``redis+sentinel://`` URL gives the client of the master a real Sentinel names: a
redis-server and a redis-server in Sentinel mode of the test's own, on free loopback ports;
and the hot path's pinned connections follow the master the Sentinels fail over to."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ops.local.cluster import free_ports
from store.redis_client import client_from_url, is_cluster
from store.redis_direct import direct_command
from store.redis_store import RedisStore
from tests.contract.advance_worker import make_record, next_version
from tests.support.redis_sentinel import SentinelGroup
from tests.support.redis_server import OwnRedis
from tests.support.waiting import wait_for

pytestmark = pytest.mark.redis


@pytest.fixture
def sentinel_url(tmp_path: Path) -> Iterator[str]:
    """``redis+sentinel://127.0.0.1:S/reins-test/0`` over a master and one Sentinel."""
    master = OwnRedis(tmp_path / "master")
    master.dir.mkdir()
    master.start()
    (port,) = free_ports(1)
    conf = tmp_path / "sentinel.conf"  # Sentinel rewrites its file: one of the test's own
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
        f"sentinel monitor reins-test 127.0.0.1 {master.port} 1\n"
        "sentinel down-after-milliseconds reins-test 60000\n"
    )
    binary = shutil.which("redis-server")
    assert binary is not None
    log = tmp_path / "sentinel.log"
    sentinel = subprocess.Popen([binary, str(conf), "--sentinel", "--logfile", str(log)])

    def knows_master() -> bool:
        assert sentinel.poll() is None, log.read_text() if log.exists() else "exited"
        try:
            with redis.Redis(port=port, socket_timeout=1) as probe:
                found = probe.execute_command("SENTINEL", "get-master-addr-by-name", "reins-test")
                return bool(found)
        except redis.ConnectionError:
            return False

    try:
        wait_for(knows_master, 10, "the Sentinel to name its master", every_s=0.02)
        yield f"redis+sentinel://127.0.0.1:{port}/reins-test/0"
    finally:
        if sentinel.poll() is None:
            os.kill(sentinel.pid, signal.SIGKILL)
        sentinel.wait()
        master.stop()


def test_a_sentinel_url_reaches_the_master_and_the_store_works_on_it(sentinel_url: str) -> None:
    client = client_from_url(sentinel_url, connect_timeout_s=2, timeout_s=2)
    assert not is_cluster(client)
    client.set("probe", "v")
    assert client.get("probe") == b"v"
    assert client.info("replication")["role"] == "master"
    store = RedisStore(client, prefix="reins-test")
    rec = make_record()
    store.create(rec)
    store.compare_and_set(next_version(rec), 1)
    assert store.load("acme", "t1").record_version == 2
    assert store.list("acme") == ["t1"]
    store.close()


def test_a_pinned_connection_follows_the_sentinels_to_the_new_master(tmp_path: Path) -> None:
    """After ``SENTINEL FAILOVER`` the old master takes writes until the Sentinels make it a
    replica (seconds later, dropping them): the hot path's pinned connection must not wait
    for that, but move as soon as the Sentinels name the new master."""
    group = SentinelGroup(tmp_path / "group")
    try:
        group.start()
        client = client_from_url(group.url, connect_timeout_s=1, timeout_s=1)
        execute = direct_command(client)
        assert execute("SET", "probe", "before") == b"OK"
        group.fail_over()
        group.wait_promoted(30)
        assert execute("SET", "probe", "after") == b"OK"
        with redis.Redis(port=group.replica.port) as new_master:
            assert new_master.get("probe") == b"after", "the write went to the old master"
        client.close()
    finally:
        group.stop()
