"""The direct Redis paths against the real server: what they write is what redis-py writes,
a forked child never talks on its parent's pinned socket, commands sent behind a commit
(``RedisStore.apply``'s ``after``) run and answer whatever the commit found, and a new
connection does not look redis-py's version up."""

from __future__ import annotations

import os
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from kernel.errors import ConcurrentModification
from kernel.states import LifecycleState
from store.base import prepare_commit
from store.redis_client import client_from_url
from store.redis_direct import direct_batch, direct_command
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.contract.advance_worker import make_record, next_version, row_for

pytestmark = pytest.mark.redis


def test_direct_commands_store_what_redis_py_stores(key_prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    execute = direct_command(client)
    values = ("text with spaces", b"\x00bytes\r\n", 42, -7, 1.5, 0.1 + 0.2, "")
    for n, value in enumerate(values):
        execute("HSET", f"{key_prefix}:direct", f"f{n}", value)
        client.hset(f"{key_prefix}:plain", f"f{n}", value)  # type: ignore[arg-type]
    batch = direct_batch(client)
    for value in values:
        batch.execute_command("RPUSH", f"{key_prefix}:direct:list", value)
    assert batch.execute() == list(range(1, len(values) + 1))
    client.rpush(f"{key_prefix}:plain:list", *values)
    assert client.hgetall(f"{key_prefix}:direct") == client.hgetall(f"{key_prefix}:plain")
    assert client.lrange(f"{key_prefix}:direct:list", 0, -1) == client.lrange(
        f"{key_prefix}:plain:list", 0, -1
    )
    client.close()


def test_a_forked_child_takes_a_connection_of_its_own() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    execute = direct_command(client)
    parent = int(execute("CLIENT", "ID"))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, str(int(execute("CLIENT", "ID"))).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 64).decode() or "0")
    os.close(read)
    os.waitpid(pid, 0)
    assert child not in (0, parent), "the child asked on a socket of its own"
    assert int(execute("CLIENT", "ID")) == parent, "the parent's pinned connection is intact"
    client.close()


def test_commands_after_a_commit_share_its_round_trip_and_run_whatever_it_found(
    key_prefix: str,
) -> None:
    store = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    after = [("INCR", f"{key_prefix}:after"), ("HSET", f"{key_prefix}:after", "f", "v")]
    replies: list[Any] = []
    assert store.apply(prepare_commit(v2, 1, [row_for(v2, 0)]), after=after, replies=replies) == 2
    assert replies[0] == 1 and isinstance(replies[1], ResponseError), "in order, errors in place"
    replies.clear()
    lost = next_version(v2)
    with pytest.raises(ConcurrentModification):
        store.apply(prepare_commit(lost, 1, [row_for(lost, 1)]), after=after[:1], replies=replies)
    assert replies == [2], "sent behind the commit that lost, and answered"
    assert store.load("acme", "t1") == v2
    store.close()


def test_a_new_connection_names_its_library_without_looking_its_version_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("redis.driver_info")  # older redis-py versions look nothing up
    client = client_from_url(REDIS_URL)  # its driver metadata was resolved at import

    def looked_up() -> str:
        raise AssertionError("redis-py looked its version up for a connection")

    monkeypatch.setattr(redis.utils, "get_lib_version", looked_up)
    assert direct_command(client)("PING") in (b"PONG", "PONG", True), "a new connection works"
    driver = client.connection_pool.connection_kwargs["driver_info"]
    assert (driver.name, driver.lib_version) == ("redis-py", redis.__version__), "still named"
    client.close()
