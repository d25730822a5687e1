"""Local capacity gates for tools: an approved action that does not fit stays held; a tool call
that does not fit stays queued. Units are physical (slots and memory), not tokens."""

from __future__ import annotations

import dataclasses

import pytest

from kernel.errors import InvalidInput
from kernel.events import DispatchTool, HoldForApproval
from kernel.states import LifecycleState
from router.admission.capacity import ToolCapacity, ToolQueue
from tests.kernel.driver import BIG_REFUND, PLAN, READ, Driver

UNITS = {"sandbox_slots": 2, "memory_mb": 8_192}


def held_refund(capacity: ToolCapacity) -> tuple[Driver, HoldForApproval]:
    d = Driver()
    d.ctx = dataclasses.replace(d.ctx, capacity=capacity.fits)  # the kernel's plug-in point
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    d.reply(d.admit(), BIG_REFUND)
    (hold,) = d.commands(HoldForApproval)
    return d, hold


def test_an_approved_action_that_does_not_fit_stays_awaiting_approval() -> None:
    capacity = ToolCapacity(UNITS, {"issue_refund": {"sandbox_slots": 1, "memory_mb": 512}})
    assert capacity.acquire("job-1", {"sandbox_slots": 1})
    assert capacity.acquire("job-2", {"sandbox_slots": 1})  # every sandbox is busy
    d, hold = held_refund(capacity)
    result = d.decide(hold)
    assert d.rec.state is LifecycleState.AWAITING_APPROVAL and not d.commands(DispatchTool)
    assert [r.outcome for r in result.rows] == ["approved_not_admitted"]
    assert result.rows[0].detail["capacity"] is False
    assert capacity.free() == {"sandbox_slots": 0, "memory_mb": 8_192}  # fits() only reads
    capacity.release("job-1")
    d.decide(hold)  # the decision delivered again finds room
    assert d.rec.state is LifecycleState.WAITING_TOOL and len(d.commands(DispatchTool)) == 1


def test_memory_not_slots_keeps_a_large_job_queued_and_no_small_one_overtakes_it() -> None:
    capacity = ToolCapacity(UNITS, {})
    queue = ToolQueue(capacity)
    queue.offer("build", {"sandbox_slots": 1, "memory_mb": 6_144})
    queue.offer("tests", {"sandbox_slots": 1, "memory_mb": 4_096})  # a slot is free, memory not
    queue.offer("lint", {"sandbox_slots": 1, "memory_mb": 512})
    assert queue.admit() == ["build"]
    assert queue.waiting() == ["tests", "lint"]  # head of line: lint waits behind tests
    assert capacity.free() == {"sandbox_slots": 1, "memory_mb": 2_048}
    assert queue.settle("build") == ["tests", "lint"]
    assert queue.waiting() == [] and capacity.free() == {"sandbox_slots": 0, "memory_mb": 3_584}
    assert capacity.acquire("tests", {"sandbox_slots": 1})  # already held: not charged twice
    assert capacity.free()["sandbox_slots"] == 0


def test_demands_are_checked_against_the_hosts_units() -> None:
    capacity = ToolCapacity(UNITS, {"issue_refund": lambda spec, args: {"gpus": 1}})
    queue = ToolQueue(capacity)
    with pytest.raises(InvalidInput, match="exceeds this host's capacity"):
        queue.offer("huge", {"memory_mb": 9_000})
    d = Driver()
    spec = d.ctx.agent.catalog.get("issue_refund")
    assert spec is not None
    with pytest.raises(InvalidInput, match="unknown unit 'gpus'"):
        capacity.demand_of(spec, {})
