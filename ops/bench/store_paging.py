"""``reins bench store``'s paging figures: a page of a tenant's state index at its start and a
million ids in, as the store reads it (after the last id seen) and as an offset would.

The peer is the read it replaced: the bucket sizes, then ``ZRANGEBYSCORE ... LIMIT offset``
in the bucket the offset falls in, which walks the ids before the page.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis

from kernel.states import LifecycleState
from store.redis_client import text
from store.redis_keys import bucket_of
from store.redis_store import STATE_CODES, RedisStore

TENANT = "bench-paging"
PAGE = 128
REPEATS = 21


def paging_figures(store: RedisStore, client: redis.Redis, quick: bool) -> dict[str, object]:
    """Fill one tenant's READY index with ``ids`` entries, then time a page at the first id
    and at the last page's start, each way (best of ``REPEATS``, microseconds)."""
    ids = 20_000 if quick else 1_000_000
    keys = store.index_keys(TENANT)
    code = STATE_CODES[LifecycleState.READY]
    names = [f"t{n:07d}" for n in range(ids)]
    by_bucket: dict[int, list[str]] = {}
    for name in names:
        by_bucket.setdefault(bucket_of(name), []).append(name)
    for bucket, members in by_bucket.items():
        for n in range(0, len(members), 10_000):
            client.zadd(keys[bucket], dict.fromkeys(members[n : n + 10_000], code))
    in_order = [m for b in sorted(by_bucket) for m in sorted(by_bucket[b])]
    deep = len(in_order) - PAGE - 1  # the last full page of the walk

    def by_id(at: int) -> Callable[[], list[str]]:
        after = in_order[at - 1] if at else ""
        return lambda: store.page(TENANT, LifecycleState.READY, after, PAGE)

    def by_offset(at: int) -> Callable[[], list[str]]:
        return lambda: _offset_page(client, keys, code, at)

    times = {
        name: _best(read(at))
        for name, read, at in (
            ("first", by_id, 0),
            ("deep", by_id, deep),
            ("offset_first", by_offset, 0),
            ("offset_deep", by_offset, deep),
        )
    }
    assert by_id(deep)() == by_offset(deep)() == in_order[deep : deep + PAGE]
    client.delete(*keys)
    return {
        "paging_ids": ids,
        "paging_page": PAGE,
        "page_us_at_start": round(times["first"]),
        "page_us_deep": round(times["deep"]),
        "page_deep_over_start": round(times["deep"] / times["first"], 2),
        "offset_page_us_at_start": round(times["offset_first"]),
        "offset_page_us_deep": round(times["offset_deep"]),
        "offset_page_deep_over_start": round(times["offset_deep"] / times["offset_first"], 2),
    }


def _offset_page(client: redis.Redis, keys: tuple[str, ...], code: int, offset: int) -> list[str]:
    """The page at ``offset`` as the store read it before: the sizes in one round trip, then
    LIMIT offset."""
    batch = client.pipeline(transaction=False)
    for key in keys:
        batch.zcount(key, code, code)
    sizes = [int(size) for size in batch.execute()]
    out: list[str] = []
    for key, size in zip(keys, sizes, strict=True):
        if offset >= size:
            offset -= size
            continue
        got = client.zrangebyscore(key, code, code, start=offset, num=PAGE - len(out))
        out += [text(m) for m in got]
        offset = 0
        if len(out) == PAGE:
            break
    return out


def _best(read: Callable[[], list[str]]) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        started = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - started)
    return 1e6 * best
