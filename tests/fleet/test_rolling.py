"""Rolling deploys and router restarts under load, on real processes.

Real Redis, real Celery worker processes, real router processes and the support store's shared
Redis backend; the scripted model takes a while per call, so turns are in flight whenever a
process is stopped. The broker's visibility timeout is far past the end of each test: nothing
here may be rescued by the broker redelivering a message.

* A rolling drain: each worker in turn is drained (SIGTERM to one, ``reins ring drain`` of the
  other) and restarted under its name while jobs run. Nothing is lost (every trajectory ends
  ``done``), nothing is duplicated (one refund and one email per order, one attempt per
  operation, nothing left uncertain), no turn is sent to a member after its drain was
  acknowledged, and the reconciler never had to step in.
* A drain whose grace runs out with turns still queued hands them back unstarted; a router
  sends them on to the other member under the same call ids (one attempt each).
* A router SIGKILLed mid-load and started again: admission resumes from the state in Redis and
  nothing is admitted twice.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.record import OpStatus, TrajectoryRecord
from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from router.placement.membership import Membership
from router.wire.custody import Custody
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.fleet.conftest import BROKERS, WEIGHTS
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import (
    BACKEND,
    caller_api,
    effects_by_order,
    order_of,
    over_allowance,
    start,
    stop_all,
    wait_admissions,
    wait_all_ended,
)
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
SLOW_MODEL = {
    "REINS_SCRIPTED_LATENCY_S": "0.5",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_WORKER_CONCURRENCY": "16",
    "REINS_DRAIN_GRACE_S": "30",
}


def submit(
    env: dict[str, str], client: redis.Redis, prefix: str, first: int, n: int
) -> list[tuple[str, str]]:
    """``n`` refund jobs, the tenants interleaved; their (tenant, trajectory id) pairs."""
    api = caller_api(env, client, "redis", None)
    tenants = list(WEIGHTS)
    return [
        (tenants[i % 3], api.submit(tenants[i % 3], refund_job(oid)).trajectory_id)
        for i, oid in enumerate(seed_orders(client, prefix, first, n))
    ]


def nothing_lost_or_duplicated(
    client: redis.Redis, prefix: str, ids: list[tuple[str, str]]
) -> list[TrajectoryRecord]:
    """Every trajectory ended done with one refund and one email, within its budget, and
    every operation it ran was sent once and settled (none left uncertain, none re-sent)."""
    store = RedisStore(client, prefix=prefix)
    records = [store.load(t, i) for t, i in ids]
    assert [r.trajectory_id for r in records if r.stop_reason is not StopReason.DONE] == []
    effects = effects_by_order(RedisState(client, prefix, seed=False).effects())
    assert {order_of(r): effects[order_of(r)] for r in records} == {
        order_of(r): Counter(refund=1, email=1) for r in records
    }
    assert [r.trajectory_id for r in records if over_allowance(r)] == []
    uncertain = [
        (r.trajectory_id, op.call_id, op.status.value, len(op.attempts))
        for r in records
        for op in r.operations.values()
        if op.status is not OpStatus.SETTLED or len(op.attempts) != 1
    ]
    assert uncertain == []
    return records


def test_a_rolling_drain_under_load_loses_nothing_and_duplicates_nothing(
    local_fleet: LocalFleet, fleet_env: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    env = {**fleet_env, **SLOW_MODEL}
    start(local_fleet, env=SLOW_MODEL)
    ids = submit(env, redis_client, key_prefix, 2000, 120)
    custody = Custody(redis_client, key_prefix)
    for member in ("w1", "w2"):

        def busy(m: str = member) -> bool:
            return len(custody.entrusted_to(m)) >= 8

        wait_for(busy, 60, f"{member} to hold 8 turns")
        if member == "w1":
            code = local_fleet.stop(member)  # SIGTERM, as a deploy's pod shutdown
        else:  # `reins ring drain w2`: the worker sees the flag, drains and exits by itself
            Membership(redis_client, key_prefix).drain(member)
            code = local_fleet.wait_exit(member)
        assert code == 0, local_fleet.log(member)[-3000:]
        log = local_fleet.log(member)
        assert f"drain of {member} acknowledged by" in log
        assert "after the drain was acknowledged" not in log
        assert custody.entrusted_to(member) == [], "every turn it held finished or was handed back"
        local_fleet.start("worker", member, "--backend", BACKEND, env=SLOW_MODEL)
        local_fleet.wait_ready(["w1", "w2"], ["r1", "r2"])

    wait_all_ended(RedisStore(redis_client, prefix=key_prefix), ids, 120, local_fleet)
    nothing_lost_or_duplicated(redis_client, key_prefix, ids)
    assert custody.recoveries() == [], "the drains left nothing for the reconciler"
    codes = stop_all(local_fleet)
    assert set(codes.values()) == {0}, codes


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_drain_whose_grace_runs_out_hands_queued_turns_back_under_the_same_call_ids(
    local_fleet: LocalFleet, fleet_env: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    # w1: four threads and a 1 s model, so its queue holds a backlog its 0.5 s grace cannot
    # clear; w2 has room for everything handed back.
    w1_env = {**SLOW_MODEL, "REINS_SCRIPTED_LATENCY_S": "1", "REINS_WORKER_CONCURRENCY": "4"}
    start(
        local_fleet, env={**w1_env, "REINS_WORKER_CONCURRENCY": "32"}, workers=("w2",), routers=()
    )
    start(local_fleet, env={**w1_env, "REINS_DRAIN_GRACE_S": "0.5"}, workers=("w1",))
    local_fleet.wait_ready(["w1", "w2"], ["r1", "r2"])
    ids = submit({**fleet_env, **w1_env}, redis_client, key_prefix, 3000, 40)
    custody = Custody(redis_client, key_prefix)
    wait_for(lambda: len(custody.entrusted_to("w1")) >= 10, 60, "w1 to hold a backlog")

    assert local_fleet.stop("w1") == 0, local_fleet.log("w1")[-3000:]
    log = local_fleet.log("w1")
    assert "drain grace of w1 ran out" in log
    assert "'handed back': " in log, log[-3000:]
    assert custody.entrusted_to("w1") == []
    routers = local_fleet.log("r1") + local_fleet.log("r2")
    assert "handed back by w1 (draining) sent on to w2" in routers

    wait_all_ended(RedisStore(redis_client, prefix=key_prefix), ids, 150, local_fleet)
    nothing_lost_or_duplicated(redis_client, key_prefix, ids)
    assert custody.recoveries() == []
    codes = stop_all(local_fleet)
    assert set(codes.values()) == {0}, codes


def test_a_router_killed_mid_load_and_restarted_admits_nothing_twice(
    local_fleet: LocalFleet, fleet_env: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    env = {**fleet_env, **SLOW_MODEL}
    start(local_fleet, env=SLOW_MODEL, routers=("r1",))
    ids = submit(env, redis_client, key_prefix, 4000, 120)
    feed = Feed(redis_client, key_prefix)
    wait_admissions(feed, 60, 60)
    local_fleet.kill("r1")  # SIGKILL: claims uncommitted, figures unwritten, no retirement
    admitted_before = len(feed.admissions())
    local_fleet.start("router", "r1", "--admitter", "redis", env=SLOW_MODEL)
    local_fleet.wait_ready(["w1", "w2"], ["r1"])

    wait_all_ended(RedisStore(redis_client, prefix=key_prefix), ids, 120, local_fleet)
    nothing_lost_or_duplicated(redis_client, key_prefix, ids)
    assert len(feed.admissions()) > admitted_before, "the restarted router admitted"
    # A turn admitted twice would reach a worker twice, and the second message be ignored.
    ignored = [
        line
        for w in ("w1", "w2")
        for line in local_fleet.log(w).splitlines()
        if "ignored turn message" in line
    ]
    assert ignored == []
    codes = stop_all(local_fleet)
    assert set(codes.values()) == {0}, codes
