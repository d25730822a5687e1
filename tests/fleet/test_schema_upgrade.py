"""A record-schema upgrade in the chart's documented order loses nothing.

Two builds: the older one writes and reads record schema version N (this code as it is); the
newer one (:class:`NextBuildStore`) writes version N+1 and reads both. The chart's order
(README, "Drain, crashes and rolling deploys"; ``worker.imageTag``): step 1 moves the routers
(and the API) to the newer build while the workers are held at the older one; step 2 moves
the workers. Jobs are submitted before the upgrade, between the steps and after it; some are
mid-run when each step lands.

Between the steps every turn an older worker is sent is of a version-N+1 record: it hands each
back without changing a byte, so nothing runs and nothing is lost. After step 2 every
trajectory ends ``done`` with exactly one refund and one email for its order.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis

from kernel.states import StopReason
from router.placement.membership import Membership
from router.wire.turns import TurnMessage
from store.redis_store import RedisStore
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.fleet.test_mixed_schema import CURRENT, NEXT, NextBuildStore
from worker.turn import TurnRunner

pytestmark = pytest.mark.redis
EACH = 4  # jobs submitted before the upgrade, between its steps, and after it


def cycle(inproc: InProcessFleet, runners: dict[str, TurnRunner], raw: NextBuildStore) -> int:
    """One router cycle and the turns it sent; returns how many turns were handed back (each
    checked: the record is byte for byte what it was)."""
    inproc.service.cycle()
    inproc.service.send_on_handbacks()
    sent = [(m, TurnMessage.from_payload(p)) for m, p in inproc.sent]
    inproc.sent.clear()
    handed_back = 0
    for member, msg in sent:
        before = raw.raw(msg.tenant, msg.trajectory_id)
        report = runners[member].run(msg)
        if report.reason.startswith("handed back"):
            assert raw.raw(msg.tenant, msg.trajectory_id) == before, "not a byte changed"
            assert before[1].startswith(NEXT)
            handed_back += 1
    return handed_back


def test_routers_first_then_workers_loses_nothing(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    service = inproc.service
    Membership(redis_client, key_prefix).register("w2")
    service.replica.refresh()
    older = RedisStore(redis_client, prefix=key_prefix)
    newer = NextBuildStore(redis_client, prefix=key_prefix)
    tools = inproc.runner.tools
    runners = {
        "w1": inproc.runner,
        "w2": TurnRunner(store=older, tools=tools, feed=inproc.feed, worker="w2"),
    }
    orders = seed_orders(redis_client, key_prefix, 7000, 3 * EACH)
    ids = [service.api().submit("acme", refund_job(o)).trajectory_id for o in orders[:EACH]]
    for _ in range(2):  # the first jobs are mid-run when the upgrade starts
        assert cycle(inproc, runners, newer) == 0
    assert all(newer.raw("acme", t)[1].startswith(CURRENT) for t in ids)

    # step 1: routers and the API on the newer build, workers held at the older one
    service.store = service.dispatcher.store = newer
    api = service.api()
    ids += [api.submit("acme", refund_job(o)).trajectory_id for o in orders[EACH : 2 * EACH]]
    handed_back = sum(cycle(inproc, runners, newer) for _ in range(6))
    assert handed_back > 0, "the older workers were sent version-N+1 records"
    records = [newer.load("acme", t) for t in ids]
    assert not any(r.stop_reason is not None for r in records), "nothing ran, nothing ended"

    # step 2: the workers on the newer build
    runners = {
        name: TurnRunner(store=newer, tools=tools, feed=inproc.feed, worker=name)
        for name in ("w1", "w2")
    }
    ids += [api.submit("acme", refund_job(o)).trajectory_id for o in orders[2 * EACH :]]
    for _ in range(400):
        assert cycle(inproc, runners, newer) == 0, "a newer worker reads every record"
        quiet = not inproc.feed.client.xlen(inproc.feed.handbacks_key)
        if quiet and all(newer.load("acme", t).stop_reason is not None for t in ids):
            break
    else:
        raise AssertionError("the fleet did not finish after step 2")

    assert [newer.load("acme", t).stop_reason for t in ids] == [StopReason.DONE] * len(ids)
    effects = Counter(tuple(e) for e in inproc.state.effects())
    for oid in orders:
        assert effects[("refund", oid, 3000)] == 1 and effects[("email", oid)] == 1
