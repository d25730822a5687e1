"""Every fault an operator meets, on Redis's default durability, and no write sent twice.

A redis-server of the test's own with ``appendfsync everysec`` (Redis's default: a crash may
lose its last second of acknowledged writes) holds the store and the broker of two routers and
three workers. The tool backend is another system: the support store as a service that cannot
de-duplicate, its state on the suite's Redis, so nothing it did is lost with the fleet's. 150
refunds of three tenants, each order with room for a second refund. While they run: a worker is
SIGKILLed, another drained (SIGTERM) and replaced, a router SIGKILLed and started again, then
Redis SIGKILLed and started again. Every trajectory ends; at least 95 % end ``done``; none ends
``no_progress`` after a recovery (a fault of the fleet is no stall of the agent); no process
exits on its own; and the backend was sent no write twice (counted as it received them) and
applied no refund or e-mail twice.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.chain import RowKind
from kernel.states import TERMINAL, StopReason
from ops.local.fleet import LocalFleet
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.fleet.conftest import WEIGHTS
from tests.fleet.faults import BACKEND_URL_VAR
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    ROOMY_TOTAL,
    caller_api,
    sent_twice,
    start,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for
from tests.support.redis_server import OwnRedis

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 150
EXTERNAL = "tests.fleet.faults:external_undeduplicated_store"
ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_MAX_TURN_S": "3",
    "REINS_STALL_TIMEOUT_S": "4",
    "REINS_DRAIN_GRACE_S": "5",
    "REINS_SCRIPTED_LATENCY_S": "0.5",
    "REINS_WORKER_CONCURRENCY": "24",
    "REINS_REDIS_TIMEOUT_S": "1.5",
    "REINS_REDIS_CONNECT_TIMEOUT_S": "1",
    BACKEND_URL_VAR: REDIS_URL,
}


def recovered(store: RedisStore, tenant: str, tid: str) -> int:
    """How many recoveries the trajectory's chain records."""
    rows = store.read(tenant, tid)
    return sum(1 for r in rows if r.kind is RowKind.CONTROL and r.outcome == "recovered")


def test_a_fleet_on_an_everysec_redis_survives_every_fault_and_sends_no_write_twice(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, key_prefix: str
) -> None:
    (tmp_path / "redis").mkdir()
    server = OwnRedis(tmp_path / "redis", fsync="everysec")
    server.start()
    client = redis.Redis.from_url(server.url)
    env = {**fleet_env, **ENV, "REINS_REDIS_URL": server.url, "REINS_BROKER_URL": server.url}
    (tmp_path / "fleet").mkdir()
    fleet = LocalFleet(env, tmp_path / "fleet", client)
    store = RedisStore(client, prefix=key_prefix)
    feed = Feed(client, key_prefix)
    faults: list[str] = []

    def after(admissions: int) -> None:
        wait_for(lambda: len(feed.admissions()) >= admissions, 120, f"{admissions} admissions")

    try:
        start(fleet, workers=("w1", "w2", "w3"), routers=("r1", "r2"), backend=EXTERNAL)
        api = caller_api(env, client, "redis", None)
        orders = seed_orders(redis_client, key_prefix, 5000, TRAJECTORIES, total=ROOMY_TOTAL)
        ids = submit_refunds(api, orders, list(WEIGHTS))

        after(100)  # of about 600: the faults come while every kind of turn is running
        fleet.kill("w3")
        faults.append("w3 SIGKILL")
        after(200)
        fleet.stop("w2")  # SIGTERM: drains, hands back what it has not started
        fleet.start("worker", "w4", "--backend", EXTERNAL)
        faults.append("w2 drained, w4 started")
        after(300)
        fleet.kill("r1")
        fleet.start("router", "r1", "--admitter", "redis")
        faults.append("r1 SIGKILL, started again")
        after(400)
        server.kill()  # everysec: what it acknowledged in its last second may be gone
        down_at = time.monotonic()
        server.start()
        faults.append(f"Redis SIGKILL, started again ({time.monotonic() - down_at:.2f}s down)")

        began = time.monotonic()
        wait_all_ended(store, ids, 300, fleet)  # raises if a fleet process exited on its own
        print(f"\nfaults: {faults}; every trajectory ended {time.monotonic() - began:.1f}s later")
        records = {tid: store.load(t, tid) for t, tid in ids}
        assert all(r.state in TERMINAL for r in records.values())
        stops = Counter(r.stop_reason.value for r in records.values() if r.stop_reason)
        recoveries = {tid: recovered(store, t, tid) for t, tid in ids}
        state = RedisState(redis_client, key_prefix, seed=False)
        print(
            f"stops {dict(stops)}; {sum(recoveries.values())} recoveries over "
            f"{sum(1 for n in recoveries.values() if n)} trajectories; "
            f"{state.fenced_writes()} late writes refused by their fence"
        )
        assert stops["done"] >= 0.95 * TRAJECTORIES, stops
        stalled = [
            tid
            for tid, rec in records.items()
            if rec.stop_reason is StopReason.NO_PROGRESS and recoveries[tid]
        ]
        assert stalled == [], f"ended no_progress after a recovery: {stalled[:10]}"
        twice = sent_twice(redis_client, key_prefix)
        assert twice == {}, f"a write was sent twice: {twice}"
        for name, proc in fleet.procs.items():
            if name not in ("w2", "w3"):
                assert proc.poll() is None, f"{name} exited"
    finally:
        stop_all(fleet)
        fleet.close()
        server.stop()
