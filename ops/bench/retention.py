"""``reins bench retention``: what a finished trajectory costs Redis, and what retiring it takes.

Runs the fleet benchmark's agent (``probe 10 orders``: ten ``get_order`` turns and a final
answer, every step committed by compare-and-set as the fleet does) into the Redis of
``REINS_REDIS_URL`` under a fresh prefix, then measures with ``MEMORY USAGE`` (``SAMPLES 0``:
every element) its snapshot hash, its chain list and its share of the tenant's index. The
peer is the least it could cost: one plain string holding the final record's JSON and its
chain's rows. Then retires them all (``TrajectoryStore.retire``) against the peer's
``UNLINK`` of the same keys, and checks that nothing of them is left. Keys are deleted after.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any, cast

import redis

from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import LifecycleState
from ops.bench.fleet import fast_agent
from ops.bench.peers import Peer, installed
from store.base import Retirement
from store.redis_client import client_from_url
from store.redis_store import RedisStore
from worker.models import ScriptedModel
from worker.resume import start

TENANT = "bench"
GOAL = "probe 10 orders"


def _run_one(store: RedisStore, i: int) -> TrajectoryRecord:
    """One finished 10-turn trajectory, committed step by step."""
    rec = TrajectoryRecord.create(
        trajectory_id=f"bench-{i:05d}",
        tenant=TENANT,
        user="cu_ana",  # the customer of the orders it reads
        goal=GOAL,
        agent="ops.bench.fleet:fast_agent",
        budget=fast_agent.profile.budget,
        now=time.time(),
    )
    model = ScriptedModel(fast_agent.make_policy(GOAL))
    ctx = KernelContext(fast_agent.profile)
    out = start(store, rec, ctx, model, fast_agent.make_backend())
    if out.record.state is not LifecycleState.COMPLETED:
        raise RuntimeError(f"bench trajectory ended {out.record.state}: {out.record.stop_reason}")
    return out.record


def _usage(client: redis.Redis, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def peer() -> Peer:
    """One plain string of the same bytes: its memory, and its ``UNLINK`` against a retire."""
    return Peer(
        name="redis-py SET and UNLINK of one plain string",
        version=installed("redis"),
        path="redis-py's pooled client (client.set, client.unlink, one call a key) on the same "
        "Redis; its bytes by MEMORY USAGE SAMPLES 0",
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Run ``n`` trajectories, measure them, retire them; one JSON object of figures."""
    settings = Settings.from_env(os.environ)
    prefix = f"reins-bench-{uuid.uuid4().hex[:10]}"
    client = client_from_url(settings.redis_url)
    store = RedisStore(client_from_url(settings.redis_url), prefix=prefix)
    n = 20 if quick else 200
    try:
        return _measure(client, store, n)
    finally:
        keys = list(client.scan_iter(match=f"{{{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        store.close()
        client.close()


def _measure(client: redis.Redis, store: RedisStore, n: int) -> dict[str, Any]:
    records = [_run_one(store, i) for i in range(n)]
    snap, chain, plain = [], [], []
    for rec in records:
        snap_key, chain_key = store.trajectory_keys(TENANT, rec.trajectory_id)
        snap.append(_usage(client, snap_key))
        chain.append(_usage(client, chain_key))
        rows = cast(list[bytes], client.lrange(chain_key, 0, -1))
        raw = rec.to_json() + b"".join(rows)
        peer_key = f"{store.prefix}:peer:{rec.trajectory_id}"
        client.set(peer_key, raw)
        plain.append(_usage(client, peer_key))
    index = sum(_usage(client, k) for k in store.index_keys(TENANT)) / n
    started = time.perf_counter()
    retired = [store.retire(TENANT, r.trajectory_id, r.record_version) for r in records]
    retire_s = time.perf_counter() - started
    started = time.perf_counter()
    for rec in records:
        client.unlink(f"{store.prefix}:peer:{rec.trajectory_id}")
    unlink_s = time.perf_counter() - started
    left = sum(
        client.exists(*store.trajectory_keys(TENANT, r.trajectory_id)) for r in records
    ) + sum(int(client.zcard(k)) for k in store.index_keys(TENANT))
    per = statistics.mean(snap) + statistics.mean(chain) + index
    return {
        "peer": peer().as_json(),
        "trajectories": n,
        "versions_per_trajectory": statistics.mean(r.record_version for r in records),
        "chain_rows_per_trajectory": statistics.mean(r.chain_length for r in records),
        "record_json_bytes": statistics.mean(len(r.to_json()) for r in records),
        "snap_bytes": round(statistics.mean(snap)),
        "chain_bytes": round(statistics.mean(chain)),
        "index_bytes": round(index),
        "bytes_per_finished": round(per),
        "peer_plain_bytes": round(statistics.mean(plain)),
        "bytes_ratio": round(per / statistics.mean(plain), 3),
        "retired": sum(r is Retirement.RETIRED for r in retired),
        "left_after_retire": left,
        "retire_per_s": round(n / retire_s),
        "peer_unlink_per_s": round(n / unlink_s),
        "retire_ratio": round(unlink_s / retire_s, 3),
    }
