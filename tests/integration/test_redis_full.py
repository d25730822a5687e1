"""A Redis configured as reins assumes (append-only file, ``noeviction``, a ``maxmemory``), of
the test's own, filled up: commits are refused whole, and retention still frees the space (its
scripts only delete, so they run when Redis refuses writes), after which commits go on."""

from __future__ import annotations

import pytest
import redis

from kernel.errors import StoreError
from ops.cli.durability import read_durability
from router.process.retention import RetentionSweep
from store.redis_client import client_from_url
from store.redis_store import RedisStore
from tests.contract.advance_worker import make_record, next_version
from tests.contract.test_retention_contract import KEEP_S, NOW, finish
from tests.support.redis_server import OwnRedis


def test_a_full_redis_refuses_commits_and_retention_frees_it(own_redis: OwnRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    store = RedisStore(client_from_url(own_redis.url), prefix="reins")
    for i in range(100):
        finish(store, f"old-{i:02d}", at=0.0)
    store.create(make_record("live"))
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", used - 16 * 1024)  # full: below what is used
    assert read_durability(client).warnings == [], "the server is as reins assumes"
    live = store.load("acme", "live")
    with pytest.raises(StoreError, match=r"used memory > 'maxmemory'"):
        store.compare_and_set(next_version(live), live.record_version)
    assert store.load("acme", "live") == live, "refused whole"
    sweep = RetentionSweep(store, ("acme",), lambda t: KEEP_S, lambda: NOW, every_s=0)
    assert len(sweep.sweep()) == 100
    assert store.list("acme") == ["live"]
    freed = used - int(client.info("memory")["used_memory"])
    assert freed > 64 * 1024, f"retiring freed {freed} bytes"
    assert store.compare_and_set(next_version(live), live.record_version) == 2
    store.close()
    client.close()
