"""A fleet on a real three-master Redis Cluster, with a worker SIGKILLed mid-run.

The store, the admitter, the feed, custody and membership live on the cluster
(``REINS_REDIS_URL`` is its ``redis+cluster://`` URL); the Celery broker stays on the single
Redis (``REINS_BROKER_URL``: kombu's Redis transport does not speak Cluster), and so does the
support store, which stands for the agent's own service (:mod:`tests.fleet.cluster_backend`).
One router, workers w1 and w2, a scripted model of 1 s per call. w2 is SIGKILLed by PID while
it holds turns; the reconciler recovers them from custody on the cluster. Every trajectory
ends, each stranded one ``done`` on w1, and the service shows one refund and one email per
``done`` trajectory and no more: nothing ran twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.states import TERMINAL, StopReason
from ops.local.fleet import LocalFleet
from router.wire.custody import Custody
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.fleet.conftest import WEIGHTS
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    caller_api,
    effects_by_order,
    order_of,
    over_allowance,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 60
HELD_AT_KILL = 12
BACKEND = "tests.fleet.cluster_backend:support_store_on_broker"


@pytest.fixture
def broker_prefix_cleanup(redis_client: redis.Redis, cluster_key_prefix: str) -> Iterator[None]:
    """Delete what the run left on the single Redis (the broker's and the service's keys)."""
    yield
    keys = list(redis_client.scan_iter(match=f"{cluster_key_prefix}*", count=1000))
    if keys:
        redis_client.delete(*keys)


@pytest.mark.usefixtures("broker_prefix_cleanup")
def test_a_fleet_on_the_cluster_loses_nothing_when_a_worker_is_killed(
    fleet_env: dict[str, str],
    tmp_path: Path,
    redis_cluster_url: str,
    redis_cluster: redis.Redis,
    cluster_key_prefix: str,
    redis_client: redis.Redis,
) -> None:
    prefix = cluster_key_prefix
    env = {
        **fleet_env,
        "REINS_KEY_PREFIX": prefix,
        "REINS_REDIS_URL": redis_cluster_url,
        "REINS_BROKER_URL": REDIS_URL,
        "REINS_HEARTBEAT_TIMEOUT_S": "2",
        "REINS_VISIBILITY_TIMEOUT_S": "300",  # far past the test: every recovery is reins's
        "REINS_SCRIPTED_LATENCY_S": "1.0",
        "REINS_WORKER_CONCURRENCY": "24",
    }
    fleet = LocalFleet(env, tmp_path, redis_cluster)
    store, custody = RedisStore(redis_cluster, prefix=prefix), Custody(redis_cluster, prefix)
    service = RedisState(redis_client, prefix, seed=False)
    try:
        for w in ("w1", "w2"):
            fleet.start("worker", w, "--backend", BACKEND)
        fleet.start("router", "r1", "--admitter", "redis")
        fleet.wait_ready(["w1", "w2"], ["r1"])
        api = caller_api(env, redis_cluster, "redis", None)
        orders = seed_orders(redis_client, prefix, 1000, TRAJECTORIES)
        ids = submit_refunds(api, orders, list(WEIGHTS))

        held: list[int] = [0]

        def w2_busy() -> bool:
            held[0] = len(custody.entrusted_to("w2"))
            return held[0] >= HELD_AT_KILL

        wait_for(w2_busy, 60, f"w2 to hold {HELD_AT_KILL} turns", every_s=0.05)
        stranded = {h.trajectory_id for h in custody.entrusted_to("w2")}
        fleet.kill("w2")  # SIGKILL: no drain, no deregistration, no notice
        print(f"\nw2 SIGKILLed holding {held[0]} turns")

        wait_all_ended(store, ids, 120, fleet)
        records = [store.load(t, i) for t, i in ids]
        assert all(r.state in TERMINAL for r in records)
        stops = Counter(r.stop_reason.value for r in records if r.stop_reason)
        print(f"stops {dict(stops)}")
        by_id = {r.trajectory_id: r for r in records}
        assert all(by_id[t].stop_reason is StopReason.DONE for t in stranded), stops

        recoveries = custody.recoveries()
        recovered = Counter(e["trajectory_id"] for e in recoveries)
        assert recovered, "the reconciler recovered the dead worker's turns"
        assert {e["member"] for e in recoveries} == {"w2"}
        assert set(recovered.values()) == {1}, f"each stranded turn recovered once: {recovered}"

        effects = effects_by_order(service.effects())
        for r in records:
            if r.stop_reason is StopReason.DONE:
                assert effects[order_of(r)] == Counter(refund=1, email=1), r.trajectory_id
        assert all(c["refund"] <= 1 and c["email"] <= 1 for c in effects.values())
        assert [r.trajectory_id for r in records if over_allowance(r)] == []

        codes = stop_all(fleet)
        assert all(code == 0 for code in codes.values()), codes
    finally:
        fleet.close()
