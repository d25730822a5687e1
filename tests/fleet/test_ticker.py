"""The router's ticker: time reaches trajectories that wait, on the real Redis.

A paused trajectory past its wall-clock limit ends ``wall_clock``; an approval past its time to
live expires; a tick with nothing due writes nothing; two routers ticking at once change a
record once.
"""

from __future__ import annotations

import pytest

from kernel.states import LifecycleState, StopReason
from router.process.ticker import Ticker
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.support import ManualClock

pytestmark = pytest.mark.redis
S = LifecycleState
TENANTS = ("acme", "globex", "initech")


def ticker(inproc: InProcessFleet, clock: ManualClock) -> Ticker:
    return Ticker(inproc.api, TENANTS, every_s=5.0, clock=clock)


def test_a_paused_trajectory_past_its_wall_clock_ends_and_nothing_is_written_before(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 900, 1)[0]
    job = {**refund_job(oid), "budget": {"wall_clock_s": 60}}
    sub = inproc.api.submit("acme", job)
    inproc.api.control("acme", sub.trajectory_id, "pause", "operator")
    paused = inproc.load("acme", sub.trajectory_id)
    assert paused.state is S.PAUSED
    clock = ManualClock(paused.submitted_at + 58.0)
    first, second = ticker(inproc, clock), ticker(inproc, clock)  # two routers
    assert first.tick() == [] and second.tick() == []
    assert inproc.load("acme", sub.trajectory_id) == paused, "nothing due: nothing written"

    clock.set(paused.submitted_at + 61.0)  # past the limit, but no visit is due yet
    assert first.tick() == [] and inproc.load("acme", sub.trajectory_id) == paused
    clock.set(paused.submitted_at + 64.0)
    changed = first.tick() + second.tick()
    assert changed == [sub.trajectory_id], "changed once, by whichever ticked first"
    ended = inproc.load("acme", sub.trajectory_id)
    assert ended.stop_reason is StopReason.WALL_CLOCK
    assert ended.state is S.FAILED and ended.record_version > paused.record_version


def test_an_approval_past_its_time_to_live_expires(inproc: InProcessFleet) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 950, 1, total=9000)[0]
    job = {**refund_job(oid), "goal": f"refund 6000 cents on order {oid}"}  # limit: 5000
    tid = inproc.api.submit("acme", job).trajectory_id
    inproc.run_until_quiet()
    held = inproc.load("acme", tid)
    assert held.state is S.AWAITING_APPROVAL and held.held is not None
    clock = ManualClock(held.held.expires_at - 1.0)
    tick = ticker(inproc, clock)
    assert tick.tick() == [] and inproc.load("acme", tid) == held
    clock.set(held.held.expires_at + 10.0)
    assert tick.tick() == [tid]
    after = inproc.load("acme", tid)
    assert after.state is not S.AWAITING_APPROVAL
    assert after.held is None or after.held.status.value != "held"
    inproc.run_until_quiet()
    assert ["refund", oid, 6000] not in inproc.state.effects(), "an expired approval pays nothing"
