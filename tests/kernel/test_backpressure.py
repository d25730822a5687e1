"""Capacity shortage is backpressure (seed 004 10.8.2): a tool call its gate had no room for
waits, unsent, with the gate named in the record; it is sent again under the same attempt, it
never reaches the model as an error, and once nobody waits for it it is dropped, owing nothing."""

from __future__ import annotations

import json

import pytest

from kernel.budget import Budget
from kernel.errors import UnknownReference
from kernel.events import DispatchTool, ToolDeferred
from kernel.record import ControlKind, OpStatus, TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from kernel.trace import postmortem
from tests.kernel.driver import Driver

S = LifecycleState
GATE = "tool/get_order"


def defer(d: Driver, cmd: DispatchTool, after_s: float = 0.5) -> None:
    d.now += after_s
    d.apply(
        ToolDeferred(
            now=d.now,
            call_id=cmd.call_id,
            attempt_id=cmd.attempt_id,
            gate=GATE,
            reason="concurrency",
        )
    )


def test_a_deferred_call_waits_unsent_naming_its_gate_and_is_sent_again() -> None:
    d = Driver()
    cmd = d.to_reading()
    observed = d.rec.last_observation
    defer(d, cmd)
    op = d.rec.operations[cmd.call_id]
    assert d.rec.state is S.WAITING_TOOL and op.waiting == GATE, "the record names the gate"
    assert op.status is OpStatus.REGISTERED and op.attempts == [cmd.attempt_id]
    (again,) = d.commands(DispatchTool)
    assert (again.call_id, again.attempt_id, again.args) == (cmd.call_id, cmd.attempt_id, cmd.args)
    assert again.fence > cmd.fence, "sent again under a newer fence"
    assert d.last is not None and [r.outcome for r in d.last.rows] == ["waiting"]
    assert d.rec.last_observation == observed, "nothing reaches the model"
    version = d.rec.record_version
    defer(d, again)
    assert d.rec.record_version == version + 1 and d.last is not None and not d.last.rows, (
        "a re-check moves the version (so no sweep takes the turn for stranded), one row a wait"
    )
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    op = d.rec.operations[cmd.call_id]
    assert op.waiting is None and op.status is OpStatus.SETTLED
    assert d.rec.state is S.READY and d.rec.last_observation is not None
    assert d.rec.last_observation.get("status") == "ok"


def test_a_long_wait_counts_no_error_and_never_fails_the_run() -> None:
    d = Driver()
    cmd = d.to_reading()
    for _ in range(3 * d.rec.budget.max_same_error + 5):
        defer(d, cmd)
        (cmd,) = d.commands(DispatchTool)
    assert d.rec.state is S.WAITING_TOOL and d.rec.error_streak.count == 0
    assert d.rec.ledger.tool_calls.actual == 0, "nothing was sent, nothing spent"
    d.result(cmd, {"status": "ok", "total_cents": 15000})
    assert d.rec.state is S.READY and d.rec.stop_reason is None


def test_a_wait_past_the_wall_clock_drops_the_unsent_call_and_stops() -> None:
    d = Driver(
        Budget(max_steps=20, max_tool_calls=20, max_tokens=100_000, deadline_s=1000, wall_clock_s=9)
    )
    cmd = d.to_reading()
    defer(d, cmd, after_s=20)
    op = d.rec.operations[cmd.call_id]
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.WALL_CLOCK
    assert op.status is OpStatus.SETTLED and op.evidence is not None
    assert op.evidence["status"] == "not_sent" and not d.commands(DispatchTool)
    assert d.rec.ledger.tool_calls.reserved == 0 and d.rec.ledger.tool_calls.actual == 0, (
        "never sent: the reservation is released, nothing is owed to a reconciler"
    )


def test_a_cancel_while_waiting_drops_the_unsent_call_and_ends_the_run() -> None:
    d = Driver()
    cmd = d.to_reading()
    defer(d, cmd)
    (again,) = d.commands(DispatchTool)
    d.control(ControlKind.CANCEL)
    assert d.rec.state is S.WAITING_TOOL, "a cancel waits for the calls in flight"
    defer(d, again)
    assert d.rec.state is S.CANCELED and not d.commands(DispatchTool)
    assert d.rec.operations[cmd.call_id].status is OpStatus.SETTLED


def test_a_deferral_naming_no_call_of_the_run_changes_nothing() -> None:
    d = Driver()
    cmd = d.to_reading()
    before = d.rec.to_json()
    with pytest.raises(UnknownReference):
        d.apply(
            ToolDeferred(now=1.0, call_id=cmd.call_id, attempt_id="t1/t9/a1", gate=GATE, reason="")
        )
    assert d.rec.to_json() == before


def test_a_version_6_record_reads_with_no_call_waiting() -> None:
    d = Driver()
    d.to_reading()
    raw = json.loads(d.rec.to_json())
    raw["schema_version"] = 6
    for op in raw["operations"].values():
        del op["waiting"]
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert all(op.waiting is None for op in back.operations.values())


def test_a_wait_is_no_error_in_the_postmortem() -> None:
    d = Driver()
    cmd = d.to_reading()
    defer(d, cmd)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    rows = [row for result in d.history for row in result.rows]
    assert any(r.outcome == "waiting" for r in rows)
    assert postmortem(rows)["first_error"] is None, "waiting for capacity is not an error"
