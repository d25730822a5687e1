"""Capacity shortage is backpressure: a tool call its gate had no room for waits, unsent; a
model call its provider refused ("not now") is asked again.

A worker that finds no room in a tool's gate reports :class:`~kernel.events.ToolDeferred`
instead of calling the backend (seed 004 10.8.2). The call stays registered and reserved, the
record names what it waits for (``Operation.waiting``, shown by ``reins show`` and the API),
and it is sent again under the same attempt, so the worker asks the gate again: the re-check's
schedule is the worker's, one deferral per bounded wait. Nothing reaches the model and no error
is counted. A call that nobody waits for any more (its claim withdrawn, a control pending, a
clock run out) is dropped instead: it was never sent, so its reservation is booked at nothing.

A model reply REJECTED with nothing used (HTTP 429 or 503, an overloaded provider, or a routed
model whose routes were all paused by their gates) is the provider's capacity, not the agent's
error (:func:`on_not_now`): the model is not told, no error is counted and the turn is no step;
the run goes back to READY, where admission waits on the route's gate (which the reply's
retry-after paused). The chain row names the route. :data:`MAX_REJECTIONS` refusals in a row,
with no reply in between, end the run ``failed`` with its own detail (a provider that never
serves it, or a route with no gate to pace the retries); the clocks end it sooner.
"""

from __future__ import annotations

from kernel import waits
from kernel.amounts import NOTHING
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.errors import UnknownReference
from kernel.events import DispatchTool, ModelReplied, ReplyStatus, ToolDeferred
from kernel.lifecycle import Cause, clock_stop, time_left
from kernel.record import ApprovalStatus, Operation, OpKind, OpStatus
from kernel.states import LifecycleState, StopReason

S = LifecycleState
#: Model calls refused in a row ("not now") after which a run ends ``failed``.
MAX_REJECTIONS = 50


def not_now(ev: ModelReplied) -> bool:
    """True for a reply that is the provider's "not now": REJECTED with nothing used."""
    return ev.status is ReplyStatus.REJECTED and (ev.usage is None or ev.usage.total == 0)


def on_not_now(draft: Draft, ev: ModelReplied) -> None:
    """The provider refused the call for now: back to READY, untold, uncounted (module
    docstring); the refusals in a row are bounded."""
    rec = draft.rec
    rec.rejections += 1
    route = ev.route or f"{draft.ctx.agent.model.provider}/{draft.ctx.agent.model.name}"
    rec.rejected_by = route
    detail = {"on": route, "in_a_row": rec.rejections, "retry_after_s": ev.retry_after_s}
    draft.row(RowKind.MODEL, call_id=ev.call_id, outcome="waiting", detail=detail)
    if rec.rejections >= MAX_REJECTIONS:
        draft.stop(StopReason.FAILED, f"{route} refused {rec.rejections} calls in a row")
        return
    draft.end_turn(Cause.REPLY_OBSERVE, counts_as_step=False)


def on_tool_deferred(draft: Draft, ev: ToolDeferred) -> None:
    """The call of ``ev`` was not sent for want of capacity: wait on, or drop it."""
    rec = draft.rec
    op = rec.operations.get(ev.call_id)
    if op is None or op.kind is not OpKind.TOOL or ev.attempt_id not in op.attempts:
        raise UnknownReference(
            f"trajectory {rec.trajectory_id}: no tool call {ev.call_id} attempt {ev.attempt_id}"
        )
    if ev.attempt_id not in rec.ledger.reservations or op.evidence is not None:
        draft.note = f"{ev.call_id}: deferral of an attempt already settled"
        return
    waited_for = op.eligible and op.epoch == rec.control_epoch and rec.state is S.WAITING_TOOL
    ran_out = clock_stop(rec, draft.now)
    if not waited_for or rec.pending_control is not None or ran_out is not None:
        _drop(draft, op, ev)
        if waited_for:
            if ran_out is not None:  # nothing is sent once a clock has run out
                draft.stop(ran_out, f"{op.tool} not sent: waiting for {ev.gate}")
            else:
                waits.after_result(draft)  # the pending control is carried out as the wait ends
        return
    if op.waiting != ev.gate:  # the wait begins: one row, not one per re-check
        op.waiting = ev.gate
        draft.row(
            RowKind.TOOL,
            call_id=op.call_id,
            tool=op.tool,
            outcome="waiting",
            detail={"gate": ev.gate, "reason": ev.reason, "attempt": ev.attempt_id},
        )
    draft.commands.append(_again(draft, op, ev.attempt_id))


def _again(draft: Draft, op: Operation, attempt: str) -> DispatchTool:
    """The same attempt sent again (it never left), with what time the clocks have left."""
    rec = draft.rec
    spec = draft.ctx.agent.catalog.get(op.tool or "")
    limit = spec.timeout_s if spec is not None else float("inf")
    held = rec.held
    approved = (
        held is not None
        and held.status is ApprovalStatus.APPROVED
        and held.call_key == op.idempotency_key
    )
    return DispatchTool(
        call_id=op.call_id,
        attempt_id=attempt,
        tool=op.tool or "",
        args=op.args or {},
        idempotency_key=op.idempotency_key,
        timeout_s=min(limit, time_left(rec, draft.now)),
        approval_digest=held.digest if approved and held is not None else None,
        fence=draft.fence,
    )


def _drop(draft: Draft, op: Operation, ev: ToolDeferred) -> None:
    """Settle an attempt that was never sent: nothing left the process, so nothing is owed."""
    led = draft.rec.ledger
    led.book(ev.attempt_id, NOTHING)
    op.eligible = False
    op.waiting = None
    if not any(a in led.reservations for a in op.attempts):
        op.status = OpStatus.SETTLED
    op.evidence = {"attempt": ev.attempt_id, "status": "not_sent", "code": "no_capacity"}
    draft.row(
        RowKind.TOOL,
        call_id=op.call_id,
        tool=op.tool,
        outcome="not_sent",
        detail={"gate": ev.gate, "reason": ev.reason, "attempt": ev.attempt_id},
    )
