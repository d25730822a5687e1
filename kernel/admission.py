"""Admission of the next model call: the guarded READY -> CALLING_MODEL transition.

Checks in seed 000's order (steps, tool calls, deadline, tokens), then the whole
bounded-liability test; staged escalation (seed 004 table 9) narrows the run as the budget
runs out. The call is registered and reserved before the ``CallModel`` command exists.
"""

from __future__ import annotations

from kernel.agent import Escalation
from kernel.amounts import Amounts, Dimension, model_call_liability
from kernel.chain import RowKind
from kernel.compaction import mark, prepare
from kernel.context import MISFIT_STOP, Draft
from kernel.errors import AdmissionRefused
from kernel.events import CallModel
from kernel.fastmodel import construct
from kernel.lifecycle import Cause, time_left, transition
from kernel.progress import signature
from kernel.record import EscalationStage, Operation, TrajectoryRecord
from kernel.render import render
from kernel.states import LifecycleState, StopReason

S = LifecycleState


def calls_that_fit(rec: TrajectoryRecord, liability: Amounts) -> int:
    """How many more calls at this liability fit beside the finalization reserve."""
    fits: list[int] = []
    for dim in Dimension:
        need = liability.get(dim)
        if need:
            fits.append(int(rec.ledger.headroom(dim) // need))
    return max(min(fits), 0) if fits else 1_000_000


def escalate(draft: Draft, liability: Amounts, policy: Escalation) -> bool:
    """Staged escalation (seed 004 table 9) from the admission terms; True if a stage began.

    Steer: the view shows the remaining allowance and asks for a smaller step or the final
    report. Restrict: grants narrow to read-only tools. Finalize is the admission refusal
    itself, when the next call no longer fits beside the reserve (:func:`close`).
    """
    rec = draft.rec
    left = calls_that_fit(rec, liability)
    stage = None
    if left <= policy.restrict_at_calls and rec.escalation is not EscalationStage.RESTRICT:
        stage = EscalationStage.RESTRICT
        rec.grants = rec.grants.model_copy(update={"read_only": True})  # replaced, shared
    elif left <= policy.steer_at_calls and rec.escalation is None:
        stage = EscalationStage.STEER
    if stage is None:
        return False
    rec.escalation = stage
    draft.row(RowKind.CONTROL, outcome=f"escalation_{stage}", detail={"calls_left": left})
    return True


def close(draft: Draft, dim: Dimension) -> None:
    """The next call no longer fits beside the reserve in ``dim``: the run stops. Under staged
    escalation that is its finalize stage, recorded; the closing step the agent declares (if
    any) runs from the reserve (:mod:`kernel.finalizing`)."""
    rec = draft.rec
    if draft.ctx.agent.escalation is not None:
        rec.escalation = EscalationStage.FINALIZE
        draft.row(RowKind.CONTROL, outcome="escalation_finalize", detail={"dimension": dim})
    draft.stop(MISFIT_STOP[dim])


def admit(draft: Draft) -> None:
    """Admission of the next model call: the guarded READY -> CALLING_MODEL transition.

    Checks in seed 000's order (steps, tool calls, deadline, tokens) and then the whole
    bounded-liability test; a call that cannot fit ends the run with the matching stop.
    The call is registered and reserved before the CallModel command exists.
    """
    rec, budget = draft.rec, draft.rec.budget
    if rec.state is not S.READY:
        draft.note = f"not admitted: trajectory is {rec.state.value}"
        return
    if draft.now - rec.submitted_at >= budget.wall_clock_s:
        draft.stop(StopReason.WALL_CLOCK)
        return
    if rec.pending_control is not None:
        draft.carry_out_pending_control()
        return
    led = rec.ledger
    if led.headroom(Dimension.STEPS) < 1:
        close(draft, Dimension.STEPS)
        return
    if led.headroom(Dimension.TOOL_CALLS) < 1:
        close(draft, Dimension.TOOL_CALLS)
        return
    if rec.active_s >= budget.deadline_s:
        draft.stop(StopReason.DEADLINE)
        return
    ctx = draft.ctx
    compacting = prepare(draft)
    view, folds, cap = compacting or (render(rec), 0, budget.max_output_tokens)
    tokens_in = ctx.reserved_input(ctx.estimator(view))
    liability = model_call_liability(ctx.agent.model.price, tokens_in, cap)
    staged = ctx.escalation_of(rec.tenant) if compacting is None else None
    if staged is not None and escalate(draft, liability, staged):
        view = render(rec)  # the view now carries the escalation notice
        tokens_in = ctx.reserved_input(ctx.estimator(view))
        liability = model_call_liability(ctx.agent.model.price, tokens_in, cap)
    call_id = f"{rec.trajectory_id}/m{rec.turn + 1}"
    attempt = f"{call_id}/a1"

    def register(r: TrajectoryRecord) -> None:
        r.ledger.admit(attempt, liability)  # may raise AdmissionRefused: nothing changes
        r.operations[call_id] = Operation.model_call(call_id, attempt, r.control_epoch, liability)
        r.turn += 1
        r.turn_signature = signature(r)
        mark(r, call_id, folds)

    try:
        transition(rec, S.CALLING_MODEL, draft.decide(Cause.ADMIT), draft.now, admit=register)
    except AdmissionRefused as refused:  # the budget clause of the admission check
        close(draft, Dimension(refused.dimension))
        return
    draft.commands.append(
        construct(
            CallModel,
            call_id=call_id,
            attempt_id=attempt,
            view=view,
            max_output_tokens=cap,
            timeout_s=time_left(rec, draft.now),
        )
    )
