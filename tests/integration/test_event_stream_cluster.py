"""The API's event streams read a chain through an asyncio client of the store's Redis: on a
Redis Cluster that client must be a cluster client too, or a stream of a cluster store fails."""

from __future__ import annotations

import asyncio

import pytest
import redis

from api.events import ChainFollower, frame
from kernel.errors import ConfigError
from kernel.settings import Settings
from store.redis_async import async_client_for
from store.redis_store import RedisStore
from tests.contract.advance_worker import make_record, next_version, row_for

pytestmark = pytest.mark.redis


def test_a_stream_of_a_cluster_store_reads_its_chain(
    redis_cluster: redis.Redis, redis_cluster_url: str, cluster_key_prefix: str
) -> None:
    store = RedisStore(redis_cluster, prefix=cluster_key_prefix)
    rows = []
    for tid in ("t1", "t2", "t3"):  # three ids, three buckets: more than one master is read
        rec = make_record(tid, "acme")
        store.create(rec)
        moved = next_version(rec)
        rows += [row_for(moved, 0), row_for(moved, 1)]
        store.compare_and_set(moved, rec.record_version, rows[-2:])
    settings = Settings(redis_url=redis_cluster_url, key_prefix=cluster_key_prefix)

    async def follow() -> list[bytes]:
        tail = async_client_for(settings)
        try:
            got: list[bytes] = []
            for tid in ("t1", "t2", "t3"):
                follower = ChainFollower(tail, store, "acme", tid)
                got += [event async for event in follower.events(None, follow=False)]
            return got
        finally:
            await tail.aclose()

    assert asyncio.run(follow()) == [frame(row) for row in rows]


def test_a_bad_store_url_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="REINS_REDIS_URL"):
        async_client_for(Settings(redis_url="redis+cluster://127.0.0.1:notaport"))
    with pytest.raises(ConfigError, match="REINS_REDIS_URL: a Sentinel URL"):
        async_client_for(Settings(redis_url="redis+sentinel://127.0.0.1:26379"))
