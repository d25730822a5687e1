"""Tool results folded into the record: settle first, then stage only what is still eligible.

Every authentic result settles its reservation; it reaches the model's view only if its call
is still eligible and was registered under the current control epoch (seed 004 listing 2). A
write whose outcome is unknown is resolved as its tool declares, never retried blindly. A
write the backend refused for an older fence settles only its own attempt (ADR 0046).
"""

from __future__ import annotations

from typing import Any

from kernel import owed, shapes, waits
from kernel.amounts import (
    ONE_TOOL_CALL,
    ZERO,
    Amounts,
    Dimension,
    tool_call_charge,
    tool_call_liability,
)
from kernel.chain import RowKind
from kernel.context import MISFIT_STOP, Draft
from kernel.errors import AdmissionRefused, UnknownReference
from kernel.events import DispatchTool
from kernel.events import ToolResulted as ToolResultEvent
from kernel.lifecycle import time_left
from kernel.record import Operation, OpKind, OpStatus, StepStatus
from kernel.render import bound_result
from kernel.states import LIVE, LifecycleState, StopReason
from kernel.tools import FENCED, OnUnknown, ToolKind, ToolSpec

S = LifecycleState
BUSINESS_ERRORS = frozenset({"not_found", "invalid_state"})


def refused_by_fence(result: dict[str, Any]) -> bool:
    """True for a backend's refusal of a write whose fence is older than one it saw."""
    return result.get("code") == FENCED and result.get("status") == "error"


def on_tool_result(draft: Draft, ev: ToolResultEvent) -> None:
    """Settle first; stage for the model only if eligible under the current epoch."""
    rec = draft.rec
    op = rec.operations.get(ev.call_id)
    if op is None or op.kind is not OpKind.TOOL or ev.attempt_id not in op.attempts:
        raise UnknownReference(
            f"trajectory {rec.trajectory_id}: no tool call {ev.call_id} attempt {ev.attempt_id}"
        )
    if op.status is OpStatus.SETTLED or (
        op.evidence is not None and op.evidence.get("attempt") == ev.attempt_id
    ):
        draft.note = f"duplicate result for {ev.call_id}: already settled"
        return
    if ev.looked_up and rec.state not in LIVE:  # the reconciler's lookup, on an ended run
        owed.on_answer(draft, op, ev)
        return
    spec = draft.ctx.agent.catalog.get(op.tool or "")
    result = ev.result
    op.waiting = None  # it was sent: whatever capacity it waited for, it had
    if refused_by_fence(result):
        _on_fenced(draft, op, spec, ev)
        return
    draft.spend_time(ev.latency_s)
    status = result.get("status")
    op.evidence = {"attempt": ev.attempt_id, **result}
    draft.row(
        RowKind.TOOL,
        call_id=ev.call_id,
        tool=op.tool,
        args=op.args,
        outcome=str(status),
        error=result.get("code") if status != "ok" else None,
        duration_s=ev.latency_s,
        detail={"key": op.idempotency_key, "attempt": ev.attempt_id, "looked_up": ev.looked_up},
    )
    unknown = status == "unknown" or (ev.looked_up and status == "absent")
    if unknown and spec is not None and spec.kind is ToolKind.WRITE:
        if ev.looked_up:
            _absent(draft, op, spec, ev)
        else:
            resolve_unknown(draft, op, spec)
        return
    _settle_tool(draft, op, ev)
    carry_on(draft, op, spec, result)


def carry_on(draft: Draft, op: Operation, spec: ToolSpec | None, result: dict[str, Any]) -> None:
    """A settled call: stage its result if still eligible, then the plan or the wait goes on."""
    rec = draft.rec
    eligible = op.eligible and op.epoch == rec.control_epoch
    op.eligible = False
    if not eligible or rec.state is not S.WAITING_TOOL:
        draft.note = f"{op.call_id} settled; not staged (no longer eligible)"
        return
    problem = shapes.result_problem(draft, op, spec, result)
    if problem is not None:  # never staged: its facts would build on a broken result
        shapes.refuse_result(draft, op, result, problem)
        return
    _stage(draft, op, spec, result)
    if op.plan_step is not None and shapes.executes_plans(draft):
        if shapes.triggered(draft, result):
            shapes.reenter_planner(draft, {**result, "step": op.plan_step})
        else:
            shapes.advance(draft)
        return
    waits.after_result(draft)


def _absent(draft: Draft, op: Operation, spec: ToolSpec, ev: ToolResultEvent) -> None:
    """A lookup found no effect under the key. Its fence shuts out every attempt sent before
    it, so that is evidence settling them (sent, so counted, but without effect); it says
    nothing of an attempt sent after it. The latest attempt's answer re-sends under the key;
    an older lookup's answer (a later attempt is under way) does nothing more."""
    led = draft.rec.ledger
    position = op.attempts.index(ev.attempt_id)
    for attempt in op.attempts[:position]:
        if attempt in led.reservations:
            led.book(attempt, ONE_TOOL_CALL)
    if position + 1 < len(op.attempts):
        draft.note = f"{ev.call_id}: an older lookup's answer; a later attempt is under way"
        return
    resolve_unknown(draft, op, spec, looked_up=True)


def _on_fenced(draft: Draft, op: Operation, spec: ToolSpec | None, ev: ToolResultEvent) -> None:
    """A write refused for an older fence: evidence that this attempt had no effect, since a
    newer attempt or lookup of its key reached the backend first. It is settled at one tool
    call and no dollars, recorded, and never shown to the model; the call's own outcome comes
    from its later attempt. Only if it is the attempt the record still waits for (the newer
    fence came from outside this record's history) is the key's outcome unknown: resolved as
    the tool declares, under a newer fence."""
    rec = draft.rec
    led = rec.ledger
    waiting = op.eligible and op.epoch == rec.control_epoch and rec.state is S.WAITING_TOOL
    awaited = waiting and op.attempts[-1] == ev.attempt_id and spec is not None
    held = ev.attempt_id in led.reservations
    if not held and not awaited:
        draft.note = f"late refused attempt {ev.attempt_id}: already settled"
        return
    if held:
        led.book(ev.attempt_id, ONE_TOOL_CALL)  # sent and refused: counted, nothing charged
    draft.row(
        RowKind.TOOL,
        call_id=ev.call_id,
        tool=op.tool,
        args=op.args,
        outcome="error",
        error=FENCED,
        duration_s=ev.latency_s,
        detail={
            "key": op.idempotency_key,
            "attempt": ev.attempt_id,
            "looked_up": ev.looked_up,
            "awaited": awaited,  # no newer attempt of this run explains the refusal
        },
    )
    if awaited and spec is not None:
        draft.spend_time(ev.latency_s)
        op.evidence = {"attempt": ev.attempt_id, **ev.result}
        resolve_unknown(draft, op, spec)
    elif not waiting and not any(a in led.reservations for a in op.attempts):
        op.status = OpStatus.SETTLED


def _settle_tool(draft: Draft, op: Operation, ev: ToolResultEvent) -> None:
    """Evidence settles every open attempt of the operation; billing evidence sets dollars."""
    led = draft.rec.ledger
    for attempt in op.attempts:
        if attempt not in led.reservations:
            continue
        held = led.reservations[attempt]
        if attempt == ev.attempt_id or ev.looked_up:
            if ev.charge is None and held.dollars > 0:
                # The call happened, the bill has not come: count the call, keep the dollars.
                led.book(attempt, Amounts.of(tool_calls=held.tool_calls), final=False)
                continue
            led.book(attempt, tool_call_charge(ev.charge or ZERO))
        elif held.dollars == 0:
            led.book(attempt, Amounts.of(tool_calls=held.tool_calls))
    op.status = (
        OpStatus.SETTLED
        if not any(a in led.reservations for a in op.attempts)
        else (OpStatus.REGISTERED)
    )


def _stage(draft: Draft, op: Operation, spec: ToolSpec | None, result: dict[str, Any]) -> None:
    """Fold an eligible result into facts, plan statuses and the next view."""
    rec = draft.rec
    status, code = result.get("status"), result.get("code")
    step = draft.own_step(op.plan_step)
    if status == "ok":
        draft.clear_error_streak()
        if step is not None:
            step.status = StepStatus.DONE
        if spec is not None and spec.fact_fields:
            prefix = str((op.args or {}).get(spec.fact_key, "")) if spec.fact_key else ""
            for name in spec.fact_fields:
                if name in result:
                    rec.facts[f"{prefix}.{name}" if prefix else name] = result[name]
        draft.observe(
            bound_result(result, op.call_id, draft.ctx.agent.max_result_tokens, draft.ctx.estimator)
        )
        return
    if code in BUSINESS_ERRORS and step is not None:
        step.status = StepStatus.FAILED
    draft.recoverable(
        str(code or status),
        bound_result(result, op.call_id, draft.ctx.agent.max_result_tokens, draft.ctx.estimator),
    )


def resolve_unknown(draft: Draft, op: Operation, spec: ToolSpec, looked_up: bool = False) -> None:
    """A call whose outcome is unknown: a write is resolved as its tool declares, never
    blindly; a read (no effect to duplicate) is simply sent again under the same key."""
    rec = draft.rec
    op.status = OpStatus.UNKNOWN  # the reservation stays until evidence settles it
    timeout = time_left(rec, draft.now)
    rule = spec.on_unknown if spec.kind is ToolKind.WRITE else OnUnknown.RESEND
    if rule is OnUnknown.STOP or timeout <= 0:  # nothing is re-sent once a clock ran out
        draft.stop(StopReason.UNKNOWN_OUTCOME, f"{spec.name} under key {op.idempotency_key}")
        return
    attempt = f"{op.call_id}/a{len(op.attempts) + 1}"
    if rule is OnUnknown.LOOKUP and not looked_up:
        owed.send_lookup(draft, op, attempt, spec.name)
        return
    # resend (or a lookup that found no effect): a new attempt under the same key,
    # registered and reserved before it is sent.
    try:
        rec.ledger.admit(attempt, tool_call_liability(spec.liability or ZERO))
    except AdmissionRefused as refused:
        draft.stop(MISFIT_STOP[Dimension(refused.dimension)])
        return
    op.attempts.append(attempt)
    op.status = OpStatus.REGISTERED
    rec.tool_dispatches += 1
    draft.commands.append(
        DispatchTool(
            call_id=op.call_id,
            attempt_id=attempt,
            tool=spec.name,
            args=op.args or {},
            idempotency_key=op.idempotency_key,
            timeout_s=min(spec.timeout_s, timeout),
            fence=draft.fence,
        )
    )
