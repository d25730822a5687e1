"""Control actions, approval decisions and the passing of time.

Pause enters PAUSED only from READY: from a live call or wait it records the pending control,
withdraws eligibility, advances the control epoch, ends the wait and steps READY -> PAUSED under
the same pending control, all in one step, so there is no moment at which work could be admitted
(seed 004 10.4.3).
Withdrawal never refunds: outstanding operations keep their reservations until evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel import finalizing, policy_holds, tool_job_polls, waits
from kernel.amounts import ZERO, Dimension, tool_call_liability
from kernel.authority import barrier
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.dispatch import dispatch, proposal_digest, refusal
from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import ApprovalDecided, CancelCall, ControlRequested, Enqueue, ToolProgress
from kernel.job_specs import OnPause
from kernel.lifecycle import Cause, clock_refusal, clock_stop
from kernel.record import (
    ApprovalStatus,
    ControlKind,
    HeldProposal,
    HoldReason,
    OpKind,
    OpStatus,
    PendingControl,
    StepStatus,
    TrajectoryRecord,
)
from kernel.states import LIVE, LifecycleState, StopReason
from kernel.tools import ToolSpec

S = LifecycleState
#: States in which nothing new is admitted: a pause, a stop under way, or the end.
ADMISSION_STOPPED = frozenset({S.PAUSED, S.FINALIZING, S.COMPLETED, S.FAILED, S.CANCELED})


def _withdraw(draft: Draft, stop_jobs: bool = False) -> None:
    """Withdraw every outstanding claim on results: eligibility off, epoch forward; a held
    proposal is withdrawn too (its approval would need fresh authorization). A running job
    is asked to stop if ``stop_jobs`` or its tool's pause policy says so; else it runs on."""
    rec = draft.rec
    any_open = False
    for op in rec.operations.values():
        if op.open:
            any_open = True
            if op.eligible:
                op.eligible = False
                if op.job is None:
                    draft.commands.append(CancelCall(call_id=op.call_id))
                elif stop_jobs or tool_job_polls.policy_of(draft, op).on_pause is OnPause.CANCEL:
                    tool_job_polls.cancel(draft, op)
    if any_open:
        rec.control_epoch += 1
    held = rec.held
    if held is not None and (held.status is ApprovalStatus.HELD or approved_not_admitted(rec)):
        held.status = ApprovalStatus.WITHDRAWN
        held.decided_at = draft.now


def _step_down(draft: Draft, stop_jobs: bool = False) -> None:
    """From a live call, a wait or an approval, back to READY (explicit withdrawal)."""
    rec = draft.rec
    if rec.state in (S.CALLING_MODEL, S.WAITING_TOOL, S.AWAITING_APPROVAL):
        _withdraw(draft, stop_jobs)
        draft.move(S.READY, Cause.WITHDRAWN)


def on_control(draft: Draft, ev: ControlRequested) -> None:
    """Pause, resume, cancel, kill or interrupt; each recorded in the chain.

    The answer (``StepResult.ack``) tells three milestones apart: the request was received,
    new admission is stopped, and running work is confirmed stopped (no operation is still
    open; otherwise their call ids are listed as outstanding, still owned and reserved).
    """
    _apply_control(draft, ev)
    rec = draft.rec
    outstanding = sorted(
        op.call_id for op in rec.operations.values() if op.open or op.status is OpStatus.HANDED_OFF
    )
    stopped = rec.pending_control is not None or rec.state in ADMISSION_STOPPED
    draft.ack = {
        "request_id": ev.request_id,
        "received": True,
        "admission_stopped": stopped and ev.kind is not ControlKind.RESUME,
        "running_work_stopped": not outstanding,
        "outstanding": outstanding,
        "state": rec.state.value,
    }


def _apply_control(draft: Draft, ev: ControlRequested) -> None:
    rec = draft.rec
    if rec.state not in LIVE:
        raise IllegalTransition(rec.state.value, ev.kind.value, ev.request_id, "run has ended")
    pending = PendingControl(
        kind=ev.kind, request_id=ev.request_id, requested_by=ev.requested_by, at=ev.now
    )
    if ev.kind is ControlKind.PAUSE and rec.state is S.PAUSED:
        draft.note = "already paused"  # a repeated pause is not a new control action
        return
    draft.row(
        RowKind.CONTROL,
        outcome=ev.kind.value,
        detail={"request_id": ev.request_id, "by": ev.requested_by},
    )
    _CONTROLS[ev.kind](draft, ev, pending)


def _pause(draft: Draft, ev: ControlRequested, pending: PendingControl) -> None:
    """Suspend: claims on results withdrawn, a held proposal with them (seed 004 section
    10.5: a pause invalidates pending approval requests); then PAUSED, from READY only."""
    draft.rec.pending_control = pending
    _step_down(draft)
    draft.move(S.PAUSED, Cause.PAUSE)


def _resume(draft: Draft, ev: ControlRequested, pending: PendingControl) -> None:
    """Re-check before anything is admitted again, restoring nothing the pause withdrew: the
    clocks and the budget (past them, the run ends by its stop), then the proposal the pause
    withdrew from approval, refused to the model with its reason (expired, if its time to
    live ran out meanwhile; withdrawn otherwise): acting on it needs a fresh proposal and a
    fresh approval."""
    rec = draft.rec
    if rec.state is not S.PAUSED:
        raise IllegalTransition(rec.state.value, S.READY.value, ev.request_id, "not paused")
    paused_at = rec.pending_control.at if rec.pending_control is not None else draft.now
    rec.pending_control = None
    why = clock_refusal(rec, draft.now)
    if why is not None:
        wall = draft.now - rec.submitted_at >= rec.budget.wall_clock_s
        draft.stop(StopReason.WALL_CLOCK if wall else StopReason.DEADLINE, f"resume: {why}")
        return
    misfit = _next_call_misfit(rec)
    if misfit is not None:
        draft.stop(misfit, "resume: the budget has no room for another call")
        return
    draft.move(S.READY, Cause.RESUME)
    held = rec.held
    withdrawn = held is not None and held.status is ApprovalStatus.WITHDRAWN
    if withdrawn and held is not None and (held.decided_at or 0.0) >= paused_at:
        reason = "APPROVAL_EXPIRED" if draft.now >= held.expires_at else "APPROVAL_WITHDRAWN"
        draft.row(
            RowKind.APPROVAL,
            tool=held.tool,
            outcome=reason.lower(),
            detail={"approval_id": held.approval_id, "by": ev.requested_by},
        )
        draft.observe(refusal(held.approval_id, reason))
    draft.commands.append(Enqueue())


def _next_call_misfit(rec: TrajectoryRecord) -> StopReason | None:
    """The stop for a budget in which not even the smallest call fits any more, or None."""
    led = rec.ledger
    if led.headroom(Dimension.STEPS) < 1:
        return StopReason.MAX_STEPS
    if rec.active_s >= rec.budget.deadline_s:
        return StopReason.DEADLINE
    return None


def _cancel(draft: Draft, ev: ControlRequested, pending: PendingControl) -> None:
    """Cancel: nothing new is admitted and the calls in flight are asked to stop, then waited
    for. A tool wait keeps its claim until every result is in or its deadline passes; a
    model call's reply may settle but never act. The turn's end carries the cancel out,
    handing whatever is still open to the reconciler; between turns it is carried out now."""
    rec = draft.rec
    rec.pending_control = pending
    if rec.state is S.WAITING_TOOL:
        for op in waits.open_batch(draft):
            if op.job is None:
                draft.commands.append(CancelCall(call_id=op.call_id))
        _stop_jobs(draft)
        draft.note = "cancel: waiting for the calls in flight (up to the wait's deadline)"
        return
    if rec.state is S.CALLING_MODEL:
        _withdraw(draft)
        draft.note = "cancel: waiting for the model call to answer"
        return
    _withdraw(draft, stop_jobs=True)
    _stop_jobs(draft)  # a job a pause let run is stopped too
    rec.pending_control = None
    draft.stop(StopReason.CANCELED)


def _stop_jobs(draft: Draft) -> None:
    """Ask every job still running to stop; each keeps its reservation until its report."""
    for op in tool_job_polls.open_jobs(draft.rec):
        tool_job_polls.cancel(draft, op)


def _kill(draft: Draft, ev: ControlRequested, pending: PendingControl) -> None:
    """Kill: every call still in flight is abandoned at once (asked to stop, its outcome
    recorded unknown, its reservation kept for the reconciler) and the run ends now."""
    rec = draft.rec
    rec.pending_control = pending
    _withdraw(draft, stop_jobs=True)
    _stop_jobs(draft)  # at once: the outcome is unknown until the backend reports
    asked = {c.call_id for c in draft.commands if isinstance(c, CancelCall)}
    for op in rec.operations.values():
        if op.open:
            if op.call_id not in asked and op.job is None:
                draft.commands.append(CancelCall(call_id=op.call_id))
            op.status = OpStatus.UNKNOWN  # it may yet take effect: never assumed either way
    rec.pending_control = None
    draft.stop(StopReason.KILLED)


def _interrupt(draft: Draft, ev: ControlRequested, pending: PendingControl) -> None:
    """New instructions: claims withdrawn, the plan's pending steps superseded (the model
    plans anew against the instructions; a plan it proposes is validated as any plan)."""
    rec = draft.rec
    _step_down(draft)
    superseded = [s.id for s in rec.plan if s.status is StepStatus.PENDING]
    if superseded:
        for step in draft.own_plan():
            if step.status is StepStatus.PENDING:
                step.status = StepStatus.SUPERSEDED
    rec.last_observation = {
        "status": "interrupt",
        "instructions": ev.instructions or "",
        "superseded": superseded,
    }
    if rec.state is S.READY:
        draft.commands.append(Enqueue())


#: What each control kind does once it is recorded in the chain.
_CONTROLS: dict[ControlKind, Callable[[Draft, ControlRequested, PendingControl], None]] = {
    ControlKind.PAUSE: _pause,
    ControlKind.RESUME: _resume,
    ControlKind.CANCEL: _cancel,
    ControlKind.KILL: _kill,
    ControlKind.INTERRUPT: _interrupt,
}


def on_approval(draft: Draft, ev: ApprovalDecided) -> None:
    """A reviewer's decision: it must match the held request exactly, and dispatch re-runs
    the whole admission check; a decision that does not match changes nothing."""
    rec = draft.rec
    held = _decided_hold(draft, ev)
    wanted = ApprovalStatus.APPROVED if ev.approve else ApprovalStatus.DENIED
    if held.status is wanted:
        draft.note = f"duplicate decision on {ev.approval_id}"
        if approved_not_admitted(rec) is not None:  # not recorded again; a re-check, as a tick
            _recheck(draft, held)
        return
    if held.status is not ApprovalStatus.HELD or rec.state is not S.AWAITING_APPROVAL:
        raise UnknownReference(
            f"approval {ev.approval_id} is {held.status.value}: "
            "a late decision is kept for audit only"
        )
    if ev.now >= held.expires_at:
        _expire(draft)
    elif ev.approve:
        _approve(draft, held, ev)
    else:
        _deny(draft, held, ev)


def _decided_hold(draft: Draft, ev: ApprovalDecided) -> HeldProposal:
    """The held request ``ev`` decides: same approval id, version and digest, and a reviewer
    of the agent's; raises ``UnknownReference`` naming what does not match."""
    rec = draft.rec
    held = rec.held
    if held is None or held.approval_id != ev.approval_id:
        raise UnknownReference(f"trajectory {rec.trajectory_id}: no approval {ev.approval_id}")
    if held.held_version != ev.held_version or held.digest != ev.digest:
        raise UnknownReference(
            f"approval {ev.approval_id}: decision names version {ev.held_version} and digest "
            f"{ev.digest[:8]}..., the held request is version {held.held_version} digest "
            f"{held.digest[:8]}..."
        )
    if held.reason is not HoldReason.APPROVAL:
        raise UnknownReference(
            f"approval {ev.approval_id}: held by a {held.reason.value}, not for review; "
            "it is sent when the operator lifts it",
            code="held_by_policy",
            field="approval_id",
        )
    if ev.reviewer not in draft.ctx.agent.reviewers:
        raise UnknownReference(
            f"approval {ev.approval_id}: {ev.reviewer!r} may not decide",
            code="not_a_reviewer",
            field="reviewer",
        )
    return held


def _decision_detail(held: HeldProposal, ev: ApprovalDecided) -> dict[str, Any]:
    """What the chain keeps of a decision: the approval, the reviewer and their comment."""
    detail: dict[str, Any] = {"approval_id": held.approval_id, "reviewer": ev.reviewer}
    if ev.comment:
        detail["comment"] = ev.comment
    return detail


def _deny(draft: Draft, held: HeldProposal, ev: ApprovalDecided) -> None:
    held.status = ApprovalStatus.DENIED
    held.decided_at = ev.now
    draft.row(
        RowKind.APPROVAL,
        tool=held.tool,
        outcome="denied",
        detail=_decision_detail(held, ev),
    )
    draft.recoverable("approval_denied", refusal(held.approval_id, "APPROVAL_DENIED"))
    draft.end_turn(Cause.WITHDRAWN)


def _admission_terms(
    draft: Draft, spec: ToolSpec, held: HeldProposal, now: float
) -> dict[str, bool]:
    """Whether the approved call may be admitted now, term by term: it fits the ledger, the
    clocks allow it, the grants permit it, and local capacity has room."""
    rec = draft.rec
    fits = rec.ledger.fits(tool_call_liability(spec.liability or ZERO))
    clocks_ok = clock_refusal(rec, now) is None
    granted = barrier(rec, draft.ctx.authority_of(rec.tenant), spec, held.args) is None
    capacity = draft.ctx.capacity(rec, spec, held.args) if draft.ctx.capacity else True
    return {"fits": fits, "clocks": clocks_ok, "granted": granted, "capacity": capacity}


def _approve(draft: Draft, held: HeldProposal, ev: ApprovalDecided) -> None:
    """Record the approval and dispatch the held call if admission's terms are met now;
    otherwise it stays approved and held, re-checked at every tick (:func:`_recheck`)."""
    held.status = ApprovalStatus.APPROVED
    held.decided_at = ev.now
    _admit_approved(draft, held, ev.now, _decision_detail(held, ev))


def approved_not_admitted(rec: TrajectoryRecord) -> HeldProposal | None:
    """The approved request ``rec`` still holds undispatched (seed 004 table 8), or None."""
    held = rec.held
    waiting = rec.state is S.AWAITING_APPROVAL and held is not None
    return held if waiting and held is not None and held.status is ApprovalStatus.APPROVED else None


def _admit_approved(
    draft: Draft, held: HeldProposal, now: float, decided: dict[str, Any] | None
) -> None:
    """Dispatch an approved request whose digest, recomputed from the held arguments, is the
    one approved and whose admission terms hold now; a mismatch refuses the dispatch and
    closes the request. Terms not met: it stays approved. ``decided``: the decision's detail
    when it has just arrived (None for a later re-check, which writes a row only if it acts)."""
    rec = draft.rec
    spec = draft.ctx.agent.catalog.get(held.tool)
    if spec is None:  # pragma: no cover - the catalog is fixed for a run
        raise UnknownReference(f"tool {held.tool} is not in the catalog")
    recomputed = proposal_digest(held.tool, held.args, held.call_key, held.plan_revision)
    if recomputed != held.digest:
        _stale(draft, held, recomputed)
        return
    terms = _admission_terms(draft, spec, held, now)
    if not all(terms.values()) or rec.pending_control is not None:
        # Table 8: the decision is good, admission is not: keep the request held, approved.
        if decided is not None:
            draft.row(
                RowKind.APPROVAL,
                tool=held.tool,
                outcome="approved_not_admitted",
                detail={**decided, **terms},
            )
        draft.note = "approved, but dispatch is not admitted now: the request stays held"
        return
    draft.row(
        RowKind.APPROVAL,
        tool=held.tool,
        outcome="approved" if decided is not None else "admitted",
        detail=decided if decided is not None else {"approval_id": held.approval_id},
    )
    dispatch(
        draft,
        [(spec, held.args, held.plan_step)],
        Cause.APPROVED,
        approval_digest=held.digest,
        keys=[held.call_key],
    )


def _stale(draft: Draft, held: HeldProposal, recomputed: str) -> None:
    """The held arguments no longer hash to the approved digest: refused, never sent."""
    held.status = ApprovalStatus.WITHDRAWN
    held.decided_at = draft.now
    draft.row(
        RowKind.APPROVAL,
        tool=held.tool,
        outcome="digest_mismatch",
        error="APPROVAL_STALE",
        detail={"approval_id": held.approval_id, "approved": held.digest, "held": recomputed},
    )
    draft.recoverable("approval_stale", refusal(held.approval_id, "APPROVAL_STALE"))
    draft.end_turn(Cause.WITHDRAWN)


def _recheck(draft: Draft, held: HeldProposal) -> None:
    """A tick's re-check of an approved, undispatched request: expired past its time to live,
    withdrawn with the run's stop once a clock ran out, dispatched once its terms hold."""
    if draft.now >= held.expires_at:
        _expire(draft)
        return
    ran_out = clock_stop(draft.rec, draft.now)
    if ran_out is not None:
        held.status = ApprovalStatus.WITHDRAWN
        held.decided_at = draft.now
        draft.stop(ran_out, f"approved {held.tool} not sent: the {ran_out.value} ran out")
        return
    _admit_approved(draft, held, draft.now, None)


def _expire(draft: Draft) -> None:
    """The held proposal's time to live passed: refused with that reason; the turn ends."""
    rec = draft.rec
    held = rec.held
    assert held is not None
    held.status = ApprovalStatus.EXPIRED
    held.decided_at = draft.now
    draft.row(
        RowKind.APPROVAL,
        tool=held.tool,
        outcome="expired",
        detail={"approval_id": held.approval_id},
    )
    draft.recoverable("approval_expired", refusal(held.approval_id, "APPROVAL_EXPIRED"))
    draft.end_turn(Cause.WITHDRAWN)


MAX_LOG_LINES = 50


def on_progress(draft: Draft, ev: ToolProgress) -> None:
    """A job's log line: kept (bounded) for diagnosis; it never resumes the model."""
    rec = draft.rec
    op = rec.operations.get(ev.call_id)
    if op is None or op.kind is not OpKind.TOOL:
        raise UnknownReference(f"trajectory {rec.trajectory_id}: no tool call {ev.call_id}")
    lines = [*rec.job_logs.get(ev.call_id, ()), ev.line[:500]][-MAX_LOG_LINES:]
    rec.job_logs = {**rec.job_logs, ev.call_id: lines}  # replaced, shared between versions
    draft.row(
        RowKind.TOOL,
        call_id=ev.call_id,
        tool=op.tool,
        outcome="progress",
        detail={"line": ev.line[:500]},
    )


def abandon_closing(draft: Draft, why: str) -> None:
    """End a run whose closing call will not answer in time (its allowance passed, or its
    worker was lost): the call is asked to stop, its outcome is unknown and its reservation
    passes to the reconciler with the rest of what the run owes (:mod:`kernel.finalizing`)."""
    rec = draft.rec
    closing = rec.closing
    assert closing is not None
    op = rec.operations[closing.call_id]
    op.eligible = False
    if op.open:
        op.status = OpStatus.UNKNOWN  # it may have been sent: the reservation stays
        draft.commands.append(CancelCall(call_id=op.call_id))
    draft.row(RowKind.CONTROL, outcome="closing_abandoned", detail={"why": why})
    draft.finish(closing.detail)


def on_tick(draft: Draft) -> None:
    """Time passed: wall-clock limit first, then approval expiry."""
    rec = draft.rec
    if rec.state not in LIVE:
        closing = rec.closing
        if finalizing.awaiting(rec) and closing is not None and draft.now >= closing.until:
            abandon_closing(draft, f"the closing step's {rec.budget.finalize_s} s ran out")
            return
        tool_job_polls.polls_due(draft)  # an ended run's jobs still owe their bills
        draft.note = "ended"
        return
    if draft.now - rec.submitted_at >= rec.budget.wall_clock_s:
        _step_down(draft, stop_jobs=True)
        _stop_jobs(draft)
        if rec.state is S.PAUSED:
            rec.pending_control = None
        draft.stop(StopReason.WALL_CLOCK)
        return
    if tool_job_polls.past_deadline(draft):
        return
    tool_job_polls.polls_due(draft)
    held = rec.held
    if (
        rec.state is S.AWAITING_APPROVAL
        and held is not None
        and held.status is ApprovalStatus.HELD
        and draft.now >= held.expires_at
    ):
        _expire(draft)
        return
    approved = approved_not_admitted(rec)
    if approved is not None:
        _recheck(draft, approved)
        return
    if policy_holds.recheck(draft):  # a freeze or read-only grant lifted: the write goes
        return
    deadline = rec.wait_deadline
    if rec.state is S.WAITING_TOOL and deadline is not None and draft.now >= deadline:
        waits.on_deadline(draft)
