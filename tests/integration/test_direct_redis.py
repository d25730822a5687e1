"""The direct Redis paths (``store.redis_client``) against the real server: what they write
is what redis-py writes, and a forked child never talks on its parent's pinned socket."""

from __future__ import annotations

import os

import pytest
import redis

from store.redis_client import direct_batch, direct_command
from tests.conftest import REDIS_URL

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
