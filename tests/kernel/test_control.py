"""Seed 004 tables 4 (reply statuses) and 6 (control actions), row by row, on the step function."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernel.agent import WaitPolicy
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import (
    Admit,
    CallModel,
    CancelCall,
    DispatchTool,
    Enqueue,
    Finish,
    HoldForApproval,
    ReplyStatus,
)
from kernel.record import ApprovalStatus, ControlKind, OpStatus, StepStatus
from kernel.states import LifecycleState, StopReason
from tests.kernel.driver import BIG_REFUND, PLAN, READ, Driver

S = LifecycleState


# --- table 4: what each reply status does to the trajectory ---------------------------------


def test_completed_tool_proposal_waits_for_the_tool_once_admitted() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    assert d.rec.state is S.WAITING_TOOL
    (dispatch,) = d.commands(DispatchTool)
    op = d.rec.operations[dispatch.call_id]
    assert dispatch.attempt_id in d.rec.ledger.reservations, "registered and reserved before send"
    assert op.idempotency_key == "t1:s1"


def test_completed_proposal_requiring_review_is_held() -> None:
    d = Driver()
    d.to_approval()
    assert d.rec.state is S.AWAITING_APPROVAL
    assert d.commands(HoldForApproval) and not d.commands(DispatchTool)


def test_completed_completion_request_finalizes() -> None:
    d = Driver()
    d.reply(d.admit(), {"type": "final", "outcome": "completed", "text": "nothing to do"})
    assert d.rec.state is S.COMPLETED and d.rec.stop_reason is StopReason.DONE
    assert d.commands(Finish)


def test_completed_no_admissible_action_returns_to_ready_with_observation() -> None:
    d = Driver()
    d.reply(d.admit(), {"type": "tool", "name": "delete_everything", "args": {}})
    assert d.rec.state is S.READY
    assert d.rec.last_observation == {
        "status": "error",
        "code": "unknown_tool",
        "tool": "delete_everything",
    }
    assert d.commands(Enqueue)


@pytest.mark.parametrize(
    "status",
    [
        ReplyStatus.TRUNCATED,
        ReplyStatus.REFUSED,
        ReplyStatus.REJECTED,
        ReplyStatus.TRANSPORT_FAILURE,
        ReplyStatus.FAULTED,
    ],
)
def test_non_completed_reply_never_dispatches_even_a_parseable_call(status: ReplyStatus) -> None:
    d = Driver()
    d.reply(d.admit(), READ, status=status)
    assert d.rec.state is S.READY
    assert not d.commands(DispatchTool)
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["code"] == f"reply_{status.value.lower()}"
    assert d.rec.tool_dispatches == 0


def test_transport_failure_finalizes_when_the_budget_is_spent() -> None:
    d = Driver(Budget(max_steps=1, deadline_s=100))
    d.reply(d.admit(), None, status=ReplyStatus.TRANSPORT_FAILURE)
    d.apply(Admit(now=d.now))
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.MAX_STEPS


def test_canceled_reply_under_a_pause_stays_paused_and_is_kept_as_diagnostics() -> None:
    d = Driver()
    call = d.admit()
    d.control(ControlKind.PAUSE)
    assert d.rec.state is S.PAUSED
    assert d.commands(CancelCall)[0].call_id == call.call_id
    res = d.reply(call, READ, status=ReplyStatus.CANCELED)
    assert isinstance(res.quarantined, IllegalTransition)
    assert d.rec.state is S.PAUSED
    assert not d.commands(DispatchTool)
    assert d.rec.operations[call.call_id].status is OpStatus.SETTLED  # usage still settles


# --- table 6: control actions -----------------------------------------------------------------


def test_pause_from_ready_has_no_runnable_gap_and_blocks_admission() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    res = d.control(ControlKind.PAUSE)
    assert d.rec.state is S.PAUSED and res.ack is not None
    assert res.ack["admission_stopped"] and res.ack["running_work_stopped"]
    before = d.rec
    d.apply(Admit(now=d.now))
    assert d.rec is before, "an admission after the pause committed changes nothing"


def test_model_reply_after_pause_cannot_dispatch() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    call = d.admit()
    reserved_before = d.rec.ledger.reservations[call.attempt_id]
    res = d.control(ControlKind.PAUSE)
    assert res.ack is not None and res.ack["outstanding"] == [call.call_id]
    assert not res.ack["running_work_stopped"]
    assert d.rec.ledger.reservations[call.attempt_id] == reserved_before, "pause never refunds"
    res = d.reply(call, READ)
    assert isinstance(res.quarantined, IllegalTransition)
    assert not d.commands(DispatchTool) and d.rec.state is S.PAUSED
    assert call.attempt_id not in d.rec.ledger.reservations, "evidence settled it"


def test_tool_result_during_pause_settles_but_does_not_resume() -> None:
    d = Driver()
    dispatch = d.to_reading()
    epoch = d.rec.control_epoch
    d.control(ControlKind.PAUSE)
    assert d.rec.state is S.PAUSED and d.rec.control_epoch == epoch + 1
    d.result(dispatch, {"status": "ok", "total_cents": 4200, "order_status": "delivered"})
    assert d.rec.state is S.PAUSED
    assert dispatch.attempt_id not in d.rec.ledger.reservations
    assert d.rec.ledger.tool_calls.actual == 1
    assert "ord_1001.total_cents" not in d.rec.facts, "not staged: it was withdrawn"
    assert not d.commands(Enqueue)


def test_resume_rechecks_and_keeps_withdrawn_things_withdrawn() -> None:
    d = Driver()
    d.to_approval()
    d.control(ControlKind.PAUSE)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.WITHDRAWN
    d.control(ControlKind.RESUME, rid="c2")
    assert d.rec.state is S.READY and d.commands(Enqueue)
    assert d.rec.held.status is ApprovalStatus.WITHDRAWN
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["reason"] == "APPROVAL_WITHDRAWN", "the model is told"


def test_resume_after_the_approval_expired_is_refused_with_the_reason() -> None:
    d = Driver()
    hold = d.to_approval()
    d.control(ControlKind.PAUSE)
    assert d.rec.held is not None
    d.now = d.rec.held.expires_at + 1  # the approval's time to live runs out while paused
    d.control(ControlKind.RESUME, rid="c2")
    assert d.rec.state is S.READY and d.commands(Enqueue) and not d.commands(DispatchTool)
    assert d.rec.last_observation == {
        "approval_id": hold.approval_id,
        "status": "REFUSED",
        "reason": "APPROVAL_EXPIRED",
        "dispatch_status": "not_sent",
    }
    assert d.last is not None
    (row,) = [r for r in d.last.rows if r.kind == "approval"]
    assert row.outcome == "approval_expired" and row.detail["by"] == "operator"
    before = d.rec.to_json()
    with pytest.raises(UnknownReference, match="withdrawn"):
        d.decide(hold)  # the reviewer's late yes changes nothing
    assert d.rec.to_json() == before
    d.reply(d.admit(), BIG_REFUND)  # acting needs a fresh proposal and a fresh approval
    (fresh,) = d.commands(HoldForApproval)
    assert fresh.approval_id != hold.approval_id


def test_resume_past_the_clock_ends_the_run_instead_of_admitting() -> None:
    d = Driver(Budget(max_steps=20, max_tool_calls=20, max_tokens=100_000, wall_clock_s=100))
    d.reply(d.admit(), PLAN)
    d.control(ControlKind.PAUSE)
    d.now = 150.0
    d.control(ControlKind.RESUME, rid="c2")
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.WALL_CLOCK
    assert not d.commands(Enqueue)


def test_resume_with_no_room_for_another_call_ends_the_run() -> None:
    d = Driver(Budget(max_steps=1, max_tool_calls=20, max_tokens=100_000, deadline_s=1000))
    d.reply(d.admit(), {"type": "tool", "name": "get_order", "args": {"order_id": "ord_1001"}})
    d.control(ControlKind.INTERRUPT, instructions="hold on")
    d.control(ControlKind.PAUSE, rid="c2")
    d.control(ControlKind.RESUME, rid="c3")
    assert d.rec.stop_reason is StopReason.MAX_STEPS
    assert not d.commands(Enqueue)


def test_approval_after_withdrawal_is_refused() -> None:
    d = Driver()
    hold = d.to_approval()
    d.control(ControlKind.PAUSE)
    before = d.rec.to_json()
    with pytest.raises(UnknownReference, match="withdrawn"):
        d.decide(hold)
    assert d.rec.to_json() == before


def test_cancel_waits_for_the_calls_in_flight_then_ends_with_nothing_owed() -> None:
    d = Driver()
    dispatch = d.to_reading()
    res = d.control(ControlKind.CANCEL)
    assert d.rec.state is S.WAITING_TOOL and d.rec.pending_control is not None
    assert [c.call_id for c in d.commands(CancelCall)] == [dispatch.call_id], "asked to stop"
    assert res.ack is not None and res.ack["admission_stopped"]
    assert res.ack["outstanding"] == [dispatch.call_id]
    d.apply(Admit(now=d.now))
    assert not d.commands(CallModel), "nothing is admitted while the cancel waits"
    d.result(dispatch, {"status": "ok", "total_cents": 4200})
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.CANCELED
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.SETTLED and op.settlement_owner == "kernel"
    assert not d.rec.ledger.reservations, "every reservation settled: nothing handed off"


def test_cancel_hands_off_what_is_still_open_when_its_wait_runs_out() -> None:
    d = Driver()
    d.ctx = KernelContext(replace(d.ctx.agent, wait=WaitPolicy(deadline_s=30.0)))
    dispatch = d.to_reading()
    d.control(ControlKind.CANCEL)
    assert d.rec.wait_deadline is not None
    d.tick(d.rec.wait_deadline + 1)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.CANCELED
    op = d.rec.operations[dispatch.call_id]
    assert op.settlement_owner == "reconciler" and op.status is OpStatus.HANDED_OFF
    assert dispatch.attempt_id in d.rec.ledger.reservations, "handed off with its reservation"
    d.result(dispatch, {"status": "ok", "total_cents": 4200})  # late evidence still settles
    assert dispatch.attempt_id not in d.rec.ledger.reservations
    assert d.rec.state is S.CANCELED


def test_cancel_during_a_model_call_waits_for_the_reply_and_never_acts_on_it() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    call = d.admit()
    d.control(ControlKind.CANCEL)
    assert d.rec.state is S.CALLING_MODEL and d.commands(CancelCall)
    late = d.reply(call, READ)
    assert late.quarantined is not None and not d.commands(DispatchTool)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.CANCELED
    assert not d.rec.ledger.reservations


def test_kill_abandons_tool_calls_in_flight_at_once_their_outcome_unknown() -> None:
    d = Driver()
    dispatch = d.to_reading()
    res = d.control(ControlKind.KILL)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.KILLED
    assert [c.call_id for c in d.commands(CancelCall)] == [dispatch.call_id]
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.UNKNOWN, "it may yet take effect: never assumed either way"
    assert op.settlement_owner == "reconciler" and op.open
    assert dispatch.attempt_id in d.rec.ledger.reservations, "the reservation stays"
    assert res.ack is not None and res.ack["outstanding"] == [dispatch.call_id]
    assert not res.ack["running_work_stopped"]


def test_kill_stops_admission_and_records_unresolved_work() -> None:
    d = Driver()
    call = d.admit()
    d.control(ControlKind.KILL)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.KILLED
    assert [c.call_id for c in d.commands(CancelCall)] == [call.call_id]
    late = d.reply(call, READ)  # a late reply settles, nothing else
    assert late.quarantined is not None
    assert d.rec.state is S.CANCELED


def test_kill_abandons_a_call_an_earlier_interrupt_withdrew() -> None:
    d = Driver()
    dispatch = d.to_reading()
    d.control(ControlKind.INTERRUPT, instructions="hold on")  # withdrawn, still in flight
    assert d.rec.state is S.READY and d.rec.operations[dispatch.call_id].open
    res = d.control(ControlKind.KILL, rid="c2")
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.KILLED
    assert [c.call_id for c in d.commands(CancelCall)] == [dispatch.call_id], "asked again"
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.UNKNOWN and op.settlement_owner == "reconciler"
    assert dispatch.attempt_id in d.rec.ledger.reservations, "the reservation stays"
    assert res.ack is not None and res.ack["outstanding"] == [dispatch.call_id]


def test_interrupt_supersedes_the_pending_plan_and_asks_for_a_new_one() -> None:
    d = Driver()
    dispatch = d.to_reading()
    d.control(ControlKind.INTERRUPT, instructions="refund ord_1004 instead")
    assert d.rec.state is S.READY and d.commands(Enqueue)
    assert d.rec.last_observation == {
        "status": "interrupt",
        "instructions": "refund ord_1004 instead",
        "superseded": ["s1", "s2", "s3"],
    }
    assert {s.status for s in d.rec.plan} == {StepStatus.SUPERSEDED}
    d.result(dispatch, {"status": "ok", "total_cents": 4200})
    assert "ord_1001.total_cents" not in d.rec.facts, "the superseded read is not staged"
    # The new plan is validated as any plan (an unknown tool is refused), and the operator's
    # interrupt, not the model, asked for it: it is not counted against max_replans (0 here).
    bad = {"type": "plan", "steps": [{"id": "n1", "tool": "wire_money", "depends_on": []}]}
    d.reply(d.admit(), bad)
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["code"] == "invalid_plan"
    new = {
        "type": "plan",
        "steps": [
            {"id": "n1", "tool": "get_order", "depends_on": []},
            {"id": "n2", "tool": "issue_refund", "depends_on": ["n1"]},
        ],
    }
    d.reply(d.admit(), new)
    assert d.rec.last_observation == {"status": "ok", "code": "plan_accepted", "steps": 2}
    assert [(s.id, s.status) for s in d.rec.plan] == [
        ("n1", StepStatus.PENDING),
        ("n2", StepStatus.PENDING),
    ]
    assert d.rec.plan_revision == 2


def test_a_completion_claim_after_an_interrupt_still_owes_the_call_in_flight() -> None:
    d = Driver()
    dispatch = d.to_reading()
    d.control(ControlKind.INTERRUPT, instructions="wrap up")
    d.reply(d.admit(), {"type": "final", "outcome": "completed", "text": "done"})
    assert d.rec.state is S.READY, "completion is refused while an operation is open"
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["code"] == "obligations_open"
    d.result(dispatch, {"status": "ok", "total_cents": 4200})
    d.reply(d.admit(), {"type": "final", "outcome": "completed", "text": "done"})
    assert d.rec.state is S.COMPLETED


def test_control_on_an_ended_run_is_refused_and_changes_nothing() -> None:
    d = Driver()
    d.reply(d.admit(), {"type": "final", "outcome": "completed", "text": "x"})
    before = d.rec.to_json()
    with pytest.raises(IllegalTransition):
        d.control(ControlKind.PAUSE)
    assert d.rec.to_json() == before


# --- bad input and duplicates --------------------------------------------------------------


def test_duplicate_result_is_settled_once() -> None:
    d = Driver()
    dispatch = d.to_reading()
    d.result(dispatch, {"status": "ok", "total_cents": 4200})
    actual = d.rec.ledger.tool_calls.actual
    before = d.rec
    again = d.result(dispatch, {"status": "ok", "total_cents": 4200})
    assert again.record is before and d.rec.ledger.tool_calls.actual == actual
    assert again.note is not None and "duplicate" in again.note


def test_result_for_unknown_call_or_attempt_is_refused() -> None:
    d = Driver()
    dispatch = d.to_reading()
    before = d.rec.to_json()
    with pytest.raises(UnknownReference):
        d.result(dispatch.model_copy(update={"attempt_id": "nope"}), {"status": "ok"})
    with pytest.raises(UnknownReference):
        d.result(dispatch.model_copy(update={"call_id": "t1/t99"}), {"status": "ok"})
    assert d.rec.to_json() == before


def test_late_result_after_wait_withdrawal_never_reaches_the_view() -> None:
    d = Driver()
    dispatch = d.to_reading()
    d.control(ControlKind.INTERRUPT, instructions="stop waiting")  # withdraws the wait
    seen = d.rec.last_observation
    d.result(dispatch, {"status": "ok", "total_cents": 4200, "order_status": "delivered"})
    assert d.rec.last_observation == seen
    assert "ord_1001.total_cents" not in d.rec.facts
    assert dispatch.attempt_id not in d.rec.ledger.reservations, "but it settled"
