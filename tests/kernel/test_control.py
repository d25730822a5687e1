"""Seed 004 tables 4 (reply statuses) and 6 (control actions), row by row, on the step function."""

from __future__ import annotations

import pytest

from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import CancelCall, DispatchTool, Enqueue, Finish, HoldForApproval, ReplyStatus
from kernel.record import ApprovalStatus, ControlKind, OpStatus
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
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    d.reply(d.admit(), BIG_REFUND)
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
    from kernel.budget import Budget

    d = Driver(Budget(max_steps=1, deadline_s=100))
    d.reply(d.admit(), None, status=ReplyStatus.TRANSPORT_FAILURE)
    d.apply(__import__("kernel.events", fromlist=["Admit"]).Admit(now=d.now))
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
    d.apply(__import__("kernel.events", fromlist=["Admit"]).Admit(now=d.now))
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
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    d.reply(d.admit(), BIG_REFUND)
    d.control(ControlKind.PAUSE)
    assert d.rec.held is not None and d.rec.held.status is ApprovalStatus.WITHDRAWN
    d.control(ControlKind.RESUME, rid="c2")
    assert d.rec.state is S.READY and d.commands(Enqueue)
    assert d.rec.held.status is ApprovalStatus.WITHDRAWN


def test_approval_after_withdrawal_is_refused() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
    d.reply(d.admit(), BIG_REFUND)
    (hold,) = d.commands(HoldForApproval)
    d.control(ControlKind.PAUSE)
    before = d.rec.to_json()
    with pytest.raises(UnknownReference, match="withdrawn"):
        d.decide(hold)
    assert d.rec.to_json() == before


def test_cancel_finalizes_and_hands_off_owned_work() -> None:
    d = Driver()
    dispatch = d.to_reading()
    res = d.control(ControlKind.CANCEL)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.CANCELED
    op = d.rec.operations[dispatch.call_id]
    assert op.settlement_owner == "reconciler" and op.status is OpStatus.HANDED_OFF
    assert dispatch.attempt_id in d.rec.ledger.reservations, "handed off with its reservation"
    assert res.ack is not None and not res.ack["running_work_stopped"]
    assert d.commands(CancelCall)
    d.result(dispatch, {"status": "ok", "total_cents": 4200})  # late evidence still settles
    assert dispatch.attempt_id not in d.rec.ledger.reservations
    assert d.rec.state is S.CANCELED


def test_kill_stops_admission_and_records_unresolved_work() -> None:
    d = Driver()
    call = d.admit()
    d.control(ControlKind.KILL)
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.KILLED
    assert [c.call_id for c in d.commands(CancelCall)] == [call.call_id]
    late = d.reply(call, READ)  # a late reply settles, nothing else
    assert late.quarantined is not None
    assert d.rec.state is S.CANCELED


def test_interrupt_records_instructions_and_drops_superseded_work() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    call = d.admit()
    d.control(ControlKind.INTERRUPT, instructions="refund ord_1004 instead")
    assert d.rec.state is S.READY and d.commands(Enqueue)
    assert d.rec.last_observation == {
        "status": "interrupt",
        "instructions": "refund ord_1004 instead",
    }
    assert d.reply(call, READ).quarantined is not None, "the superseded proposal is dropped"


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
    d.result(dispatch, {"status": "ok", "total_cents": 4200, "order_status": "delivered"})
    assert d.rec.last_observation == {"status": "interrupt", "instructions": "stop waiting"}
    assert "ord_1001.total_cents" not in d.rec.facts
    assert dispatch.attempt_id not in d.rec.ledger.reservations, "but it settled"
