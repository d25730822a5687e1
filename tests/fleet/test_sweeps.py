"""The router's sweeps over the state index, on the real Redis: nothing is left stranded.

A READY trajectory whose notice was lost is queued again once it has stayed unqueued for the
grace period, and one that is queued is never touched; the cursor walks a big index in bounded
pages; a turn no custody names is recovered within twice its bound, and one a live member has
in custody is left to that member until the slow bound; a READY trajectory past its wall-clock
limit is ended by the ticker although no admission comes.
"""

from __future__ import annotations

import pytest

from kernel.states import LifecycleState, StopReason
from router.process.stranded import StrandedTurns
from router.process.sweeps import IndexCursor, ReadySweep
from router.process.ticker import Ticker
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.support import ManualClock

pytestmark = pytest.mark.redis
S = LifecycleState
TENANTS = ("acme", "globex", "initech")


def ready_sweep(inproc: InProcessFleet, clock: ManualClock, budget: int = 256) -> ReadySweep:
    admitter = inproc.service.dispatcher.admitter
    cursor = IndexCursor(inproc.store, TENANTS, (S.READY,), page_size=2)
    return ReadySweep(
        inproc.api, cursor, admitter.is_queued, grace_s=5.0, clock=clock, budget=budget
    )


def test_a_ready_trajectory_no_queue_holds_is_queued_again_after_the_grace(
    inproc: InProcessFleet,
) -> None:
    orders = seed_orders(inproc.client, inproc.prefix, 1200, 3)
    ids = [inproc.api.submit("acme", refund_job(o)).trajectory_id for o in orders]
    admitter = inproc.service.dispatcher.admitter
    lost = ids[1]
    assert admitter.withdraw(lost)  # its notice died with a router: no queue entry
    clock = ManualClock()
    sweep = ready_sweep(inproc, clock)
    assert sweep.sweep() == [] and not admitter.is_queued(lost), "first seen unqueued"
    clock.set(4.0)
    assert sweep.sweep() == [], "within the grace: its notice may still be on its way"
    clock.set(5.5)
    assert sweep.sweep() == [lost]
    assert admitter.is_queued(lost) and sweep.requeued == 1
    clock.set(20.0)
    assert sweep.sweep() == [], "the queued ones are never requeued"
    inproc.run_until_quiet()
    assert {inproc.load("acme", t).stop_reason for t in ids} == {StopReason.DONE}


def test_the_cursor_walks_a_big_index_in_bounded_pages(inproc: InProcessFleet) -> None:
    orders = seed_orders(inproc.client, inproc.prefix, 1300, 7)
    ids = {inproc.api.submit("globex", refund_job(o)).trajectory_id for o in orders}
    cursor = IndexCursor(inproc.store, TENANTS, (S.READY,), page_size=2)
    seen: list[str] = []
    laps = cursor.laps
    while cursor.laps == laps:
        page = cursor.take(3)
        assert len(page) <= 3
        seen += [tid for _, tid in page]
    assert set(seen) == ids and len(seen) == len(ids), "one walk sees each once"


def test_a_turn_no_custody_names_is_recovered_and_one_in_custody_waits_for_its_member(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 1400, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()  # admitted and sent; its custody entry names member w1
    assert inproc.custody.entrusted_to("w1")[0].trajectory_id == tid
    clock = ManualClock()
    sweep = StrandedTurns.over(
        inproc.api, TENANTS, custody=inproc.custody, after_s=5.0, slow_after_s=60.0, clock=clock
    )
    for now in (0.0, 6.0, 12.0, 30.0):  # first seen; first read; then held by w1: left alone
        clock.set(now)
        assert sweep.sweep() == []
    assert inproc.load("initech", tid).record_version == msg.version
    clock.set(67.0)  # the slow bound after the version was first read (at 6.0)
    assert sweep.sweep() == [tid], "past the slow bound even a member's turn is recovered"
    assert inproc.load("initech", tid).state is S.READY

    oid = seed_orders(inproc.client, inproc.prefix, 1410, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    inproc.run_until_quiet()  # (the recovered one and the new one)
    inproc.api.submit("initech", refund_job(seed_orders(inproc.client, inproc.prefix, 1420, 1)[0]))
    inproc.cycle()
    (msg,) = inproc.take()
    key = f"{msg.tenant}/{msg.trajectory_id}"
    inproc.client.hdel(inproc.custody.key("w1"), key)  # died between its commit and custody
    clock = ManualClock(100.0)
    sweep = StrandedTurns.over(
        inproc.api, TENANTS, custody=inproc.custody, after_s=5.0, slow_after_s=60.0, clock=clock
    )
    found = []
    for now in (100.0, 105.5, 111.0):
        clock.set(now)
        found += sweep.sweep()
    assert found == [msg.trajectory_id], "no custody: recovered within twice the bound"


def test_a_ready_trajectory_past_its_wall_clock_ends_without_an_admission(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 1500, 1)[0]
    job = {**refund_job(oid), "budget": {"wall_clock_s": 60}}
    tid = inproc.api.submit("acme", job).trajectory_id
    ready = inproc.load("acme", tid)
    assert ready.state is S.READY
    clock = ManualClock(ready.submitted_at + 61.0)
    assert Ticker(inproc.api, TENANTS, every_s=5.0, clock=clock).tick() == [tid]
    ended = inproc.load("acme", tid)
    assert ended.stop_reason is StopReason.WALL_CLOCK and ended.state is S.FAILED
    assert not inproc.service.dispatcher.admitter.is_queued(tid), "its queue entry withdrawn"


def test_a_turn_that_waited_behind_a_busy_queue_gets_its_whole_hold_once_the_queue_empties(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 1430, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()  # held by w1, whose queue we report below
    depth = {"w1": 12}
    clock = ManualClock()
    sweep = StrandedTurns.over(
        inproc.api,
        TENANTS,
        custody=inproc.custody,
        after_s=2.0,
        slow_after_s=600.0,
        held_after_s=6.0,
        clock=clock,
        queued=depth.get,
    )
    for now in (0.0, 2.0, 4.0, 6.0, 8.0):  # the message waits behind twelve others
        clock.set(now)
        assert sweep.sweep() == []
    depth["w1"] = 0  # the queue emptied: the turn began at the earliest at 8.0
    for now in (10.0, 12.0):
        clock.set(now)
        assert sweep.sweep() == [], "a turn that just began is not taken for lost"
    assert inproc.load("initech", tid).record_version == msg.version
    clock.set(14.0)  # the hold, counted from when the queue was last seen busy
    assert sweep.sweep() == [tid]
