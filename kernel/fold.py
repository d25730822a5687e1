"""Folding model replies into the record (tool results are in :mod:`kernel.results`).

Every authentic result settles; only a result whose call is still eligible, registered under
the current control epoch, reaches the model's view (seed 004 listing 2). Only a COMPLETED
reply can become a proposal (table 4); anything else is an observation or diagnostics.
"""

from __future__ import annotations

from typing import Any

from kernel import backpressure, compaction, finalizing, owed, policy_holds, shapes
from kernel.amounts import NOTHING, Amounts, model_call_charge
from kernel.authority import barrier
from kernel.chain import RowKind
from kernel.context import MISFIT_STOP, Draft
from kernel.dispatch import Call, announce, call_key, dispatch, refusal, review_request, same_effect
from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import ModelReplied, ReplyStatus
from kernel.lifecycle import Cause, clock_stop
from kernel.plan import adopt, open_steps, validate_plan
from kernel.progress import fingerprint
from kernel.record import (
    Operation,
    OpKind,
    OpStatus,
    StepStatus,
    TrajectoryRecord,
)
from kernel.states import LifecycleState, StopReason
from kernel.tools import ToolKind, ToolSpec

S = LifecycleState


# --- model replies ---------------------------------------------------------------------------


def on_model_reply(draft: Draft, ev: ModelReplied) -> None:
    """Settle the call, then route the reply by its status and content."""
    rec = draft.rec
    op = rec.operations.get(ev.call_id)
    if op is None or op.kind is not OpKind.MODEL:
        raise UnknownReference(f"trajectory {rec.trajectory_id}: no model call {ev.call_id}")
    if op.evidence is not None:
        draft.note = f"duplicate reply for {ev.call_id}: already settled"
        return
    evidence, over = _settle_reply(draft, op, ev)
    if finalizing.awaiting(rec, ev.call_id):  # the closing step's call (FINALIZING)
        _on_closing_reply(draft, ev)
        return
    current = rec.state is S.CALLING_MODEL and op.eligible and op.epoch == rec.control_epoch
    if not current:
        _quarantine(draft, op, ev, evidence)
        return
    op.eligible = False
    if over is not NOTHING and _stopped_by_overrun(draft, over):
        return
    ran_out = clock_stop(rec, draft.now)
    if ev.timed_out or ran_out is not None:  # its timeout was the time left on the clocks
        draft.stop(ran_out or StopReason.DEADLINE)
        return
    if rec.scratchpad is not None and compaction.took_reply(draft, ev):
        return
    if ev.status is not ReplyStatus.COMPLETED:
        _not_completed(draft, ev)
        return
    _route_proposal(draft, ev.content)


def _not_completed(draft: Draft, ev: ModelReplied) -> None:
    """A reply that did not complete: the provider's "not now" is backpressure
    (:mod:`kernel.backpressure`); anything else is an observation the model sees and an error
    that counts."""
    if backpressure.not_now(ev):  # the provider's capacity, not the agent's error
        backpressure.on_not_now(draft, ev)
        return
    kind = ev.status.value.lower()
    obs: dict[str, Any] = {"status": "error", "code": f"reply_{kind}"}
    if ev.retry_after_s is not None:
        obs["retry_after_s"] = ev.retry_after_s
    draft.recoverable(f"reply_{kind}", obs)
    draft.end_turn(Cause.REPLY_OBSERVE)


def _on_closing_reply(draft: Draft, ev: ModelReplied) -> None:
    """The closing call answered (its usage already settled): keep its report if it completed
    in time, then end the run (:mod:`kernel.finalizing`)."""
    rec = draft.rec
    closing = rec.closing
    assert closing is not None
    rec.operations[closing.call_id].eligible = False
    if ev.status is ReplyStatus.COMPLETED and not ev.timed_out:
        rec.closing_report = finalizing.report_text(ev.content)
    else:
        draft.row(RowKind.CONTROL, outcome="closing_failed", detail={"status": ev.status})
    draft.finish(closing.detail)


def _quarantine(draft: Draft, op: Operation, ev: ModelReplied, evidence: dict[str, Any]) -> None:
    """A reply that outlived its claim (pause, interrupt, cancel): settled, kept as diagnostics,
    never acted on. If a cancel was waiting for it, the turn ends and the cancel is carried out."""
    rec = draft.rec
    draft.quarantined = IllegalTransition(
        rec.state.value, "WAITING_TOOL", ev.call_id, "reply is no longer eligible"
    )
    evidence["quarantined"] = True
    if ev.raw is not None:
        evidence["raw"] = ev.raw
    op.eligible = False
    waited = rec.state is S.CALLING_MODEL and rec.pending_control is not None
    unanswered = (o for o in rec.operations.values() if o.kind is OpKind.MODEL and o.open)
    if waited and all(o.evidence is not None for o in unanswered):
        draft.end_turn(Cause.WITHDRAWN)


def _book_reply(draft: Draft, op: Operation, ev: ModelReplied, attempt: str) -> Amounts:
    """Book what the reply used; returns the usage past the reservation. A "not now" used
    nothing (neither step nor token); with no usage evidence the reservation stays. Any other
    reply ends a streak of refusals (:mod:`kernel.backpressure`)."""
    rec = draft.rec
    if backpressure.not_now(ev):
        rec.ledger.book(attempt, NOTHING)
        op.status = OpStatus.SETTLED
        return NOTHING
    rec.rejections, rec.rejected_by = 0, None
    if ev.usage is None:
        op.status = OpStatus.UNKNOWN
        return NOTHING
    op.status = OpStatus.SETTLED
    charge = model_call_charge(draft.ctx.agent.model.price_of(ev.route), ev.usage)
    return rec.ledger.book(attempt, charge)


def _settle_reply(draft: Draft, op: Operation, ev: ModelReplied) -> tuple[dict[str, Any], Amounts]:
    """Book the reply's usage (or keep the reservation when it has none) and write its chain
    row; returns the call's evidence and the usage past the reservation."""
    draft.spend_time(ev.latency_s)
    attempt = op.attempts[-1]
    # The proposal itself goes to the chain; the record keeps only what decisions need,
    # plus the raw text of any reply that did not complete, for diagnostics.
    evidence: dict[str, Any] = {"status": ev.status.value}
    op.evidence = evidence
    if ev.status is not ReplyStatus.COMPLETED and ev.raw is not None:
        evidence["raw"] = ev.raw
    over = _book_reply(draft, op, ev, attempt)
    usage = ev.usage
    detail: dict[str, Any] = {"proposal": ev.content, "timed_out": ev.timed_out}
    if usage is not None and usage.cached_input:
        detail["cached_in"] = usage.cached_input  # charged at the cached price
    if usage is not None and usage.cache_write_input:
        detail["cache_write_in"] = usage.cache_write_input
    if ev.route is not None:
        detail["route"] = ev.route  # which deployment answered, and after which refusals
    if ev.fell_back:
        detail["fell_back"] = list(ev.fell_back)
    if over is not NOTHING:
        detail["overrun"] = over.model_dump(mode="json")
    pad = draft.rec.scratchpad
    if pad is not None and pad.compacting == ev.call_id:
        detail["purpose"] = "compaction"
    closing = draft.rec.closing
    if closing is not None and closing.call_id == ev.call_id:
        detail["purpose"] = "closing"
    draft.row(
        RowKind.MODEL,
        call_id=ev.call_id,
        outcome=ev.status.value,
        tokens_in=usage.input if usage else 0,
        tokens_out=usage.output if usage else 0,
        duration_s=ev.latency_s,
        detail=detail,
    )
    return evidence, over


def _stopped_by_overrun(draft: Draft, over: Amounts) -> bool:
    """A reply whose usage passed its reservation and took a dimension's headroom ends the run
    with that dimension's stop, before anything else can be admitted; True if it did."""
    dim = draft.rec.ledger.breached()
    if dim is None:
        return False
    draft.stop(MISFIT_STOP[dim], f"usage past its reservation by {over.get(dim)} {dim.value}")
    return True


def _route_proposal(draft: Draft, content: Any) -> None:
    kind = content.get("type") if isinstance(content, dict) else None
    if kind == "final":
        _on_final(draft, content)
    elif kind == "plan":
        _on_plan(draft, content.get("steps"))
    elif kind == "tool":
        _on_tools(draft, [content])
    elif kind == "tools" and isinstance(content.get("calls"), list):
        _on_tools(draft, content["calls"])
    else:
        what = "not an object" if not isinstance(content, dict) else f"unknown type {kind!r}"
        draft.recoverable(
            "malformed_reply", {"status": "error", "code": "malformed_reply", "detail": what}
        )
        draft.end_turn(Cause.REPLY_OBSERVE)


def _on_final(draft: Draft, content: dict[str, Any]) -> None:
    rec = draft.rec
    outcome = content.get("outcome")
    if outcome == "completed" and _not_yet_complete(draft):
        draft.end_turn(Cause.REPLY_OBSERVE)
        return
    if outcome == "completed":
        check = draft.ctx.agent.acceptance
        reason = check(rec) if check is not None else None
        if reason is not None:
            draft.stop(StopReason.FAILED, f"acceptance check failed: {reason}")
            return
        draft.stop(StopReason.DONE)
    else:
        draft.stop(StopReason.FAILED, f"agent reported {outcome!r}")


def _not_yet_complete(draft: Draft) -> bool:
    """A completion claim while plan steps are pending or operations still owe a settlement
    (a result not yet in, an unknown outcome): the model is told, and the run goes on; True
    if so. Completion never hands an obligation off."""
    rec = draft.rec
    pending = open_steps(rec.plan)
    if pending:
        draft.recoverable(
            "plan_incomplete", {"status": "error", "code": "plan_incomplete", "detail": pending}
        )
        return True
    _write_off_unheard_model_calls(draft)
    owed = [op.call_id for op in rec.operations.values() if op.open]
    if owed:
        draft.recoverable(
            "obligations_open", {"status": "error", "code": "obligations_open", "detail": owed}
        )
        return True
    return False


def _write_off_unheard_model_calls(draft: Draft) -> None:
    """A model call whose bill was never heard (its worker died, or the reply carried no
    usage) is charged its whole reservation when the run claims completion: the worst case
    it could have cost becomes its cost, so nothing is released without evidence, and a
    completed run owes nothing. A reply that turns up later is then a duplicate."""
    for op in draft.rec.operations.values():
        if op.kind is OpKind.MODEL and op.status is OpStatus.UNKNOWN:
            owed.write_off(draft, op, "no bill came before completion")


def _on_plan(draft: Draft, steps: Any) -> None:
    rec = draft.rec
    budget = rec.budget
    replanning = bool(rec.plan)
    executing = shapes.executes_plans(draft)
    # An operator's interrupt superseded the plan: the new one it asks for is not a replan.
    asked = (
        replanning
        and not open_steps(rec.plan)
        and any(s.status is StepStatus.SUPERSEDED for s in rec.plan)
    )
    if replanning and not asked and rec.plan_revision - 1 >= shapes.replan_bound(draft):
        problems = ["a plan is already set"]
    else:
        problems = validate_plan(steps, draft.ctx.agent.catalog, budget.max_plan_steps)
        if executing and not problems:
            problems = shapes.reference_problems(steps)
    if problems:
        draft.recoverable(
            "invalid_plan", {"status": "error", "code": "invalid_plan", "detail": problems}
        )
    else:
        rec.plan = adopt(steps)
        rec.plan_revision += 1
        if replanning:
            # A revision withdraws the claim of everything proposed under the old plan.
            rec.control_epoch += 1
        draft.clear_error_streak()
        draft.observe({"status": "ok", "code": "plan_accepted", "steps": len(rec.plan)})
        if executing:
            shapes.advance(draft)  # the kernel runs the plan; the model is not called per step
            return
    draft.end_turn(Cause.REPLY_OBSERVE)


def _on_tools(draft: Draft, calls: list[Any]) -> None:
    """Validate each proposed call, then hold, dispatch, or observe; never dispatch twice."""
    rec = draft.rec
    admitted: list[Call] = []
    for call in calls:
        if len(admitted) >= rec.budget.max_fanout:
            break
        name, args, plan_step = _parts(call)
        fp = fingerprint(str(name), args)
        rec.seen[fp] = rec.seen.get(fp, 0) + 1
        if rec.seen[fp] > rec.budget.max_repeat:
            draft.stop(StopReason.REPEATED_CALL, f"{name} proposed {rec.seen[fp]} times")
            return
        known = _known_call(draft, name, args)
        if known is None:
            continue
        spec, clean = known
        plan_step = _in_plan(rec, plan_step)
        bar = barrier(rec, draft.ctx.authority_of(rec.tenant), spec, clean)
        if bar is not None and not bar.hold:  # refused to the model as a policy result
            policy_holds.refuse(draft, spec, clean, bar)
            continue
        if spec.kind is ToolKind.WRITE and _answered_once(draft, spec, clean, plan_step):
            continue
        if bar is not None:  # a freeze or a read-only grant: held, not sent
            policy_holds.hold(draft, spec, clean, plan_step, bar)
            return
        if spec.needs_approval(clean):
            _hold(draft, spec, clean, plan_step)
            return
        admitted.append((spec, clean, plan_step))
    if not admitted:
        draft.end_turn(Cause.REPLY_OBSERVE)
        return
    dispatch(draft, admitted, Cause.REPLY_TOOLS)


def _parts(call: Any) -> tuple[Any, Any, Any]:
    """A proposed call's name, arguments and plan step (None for what it lacks)."""
    if not isinstance(call, dict):
        return None, None, None
    return call.get("name"), call.get("args"), call.get("plan_step")


def _in_plan(rec: TrajectoryRecord, plan_step: Any) -> str | None:
    """``plan_step`` when it names a step of the plan, else None."""
    if isinstance(plan_step, str) and any(s.id == plan_step for s in rec.plan):
        return plan_step
    return None


def _answered_once(
    draft: Draft, spec: ToolSpec, args: dict[str, Any], plan_step: str | None
) -> bool:
    """A write this trajectory already made under the same key is one effect: the model gets
    its stored result (or, while it is in flight, a refusal to send it twice); True if so."""
    key = call_key(draft, spec, args, plan_step, 0)
    earlier = same_effect(draft.rec, key)
    if earlier is None:
        return False
    evidence = earlier.evidence
    if earlier.status is OpStatus.SETTLED and evidence is not None:
        stored = {k: v for k, v in evidence.items() if k != "attempt"}
        draft.row(
            RowKind.TOOL,
            call_id=earlier.call_id,
            tool=spec.name,
            args=args,
            outcome="replayed",
            detail={"key": key},
        )
        draft.observe({**stored, "replayed": True, "call_id": earlier.call_id})
    else:
        draft.recoverable(
            "duplicate_in_flight",
            {"status": "error", "code": "duplicate_in_flight", "call_id": earlier.call_id},
        )
    return True


def _known_call(draft: Draft, name: Any, args: Any) -> tuple[ToolSpec, dict[str, Any]] | None:
    """The catalog's spec for ``name`` and ``args`` validated against it; or None, once the
    model is told why not (an unknown tool, or arguments that break the tool's schema)."""
    spec = draft.ctx.agent.catalog.get(name) if isinstance(name, str) else None
    if spec is None:
        draft.recoverable(
            "unknown_tool", {"status": "error", "code": "unknown_tool", "tool": str(name)}
        )
        return None
    clean, why = spec.validate_args(args)
    if clean is None:
        draft.recoverable(
            "schema_violation", {"status": "error", "code": "schema_violation", "detail": why}
        )
        return None
    return spec, clean


def _hold(draft: Draft, spec: ToolSpec, args: dict[str, Any], plan_step: str | None) -> None:
    """Approval escrow: freeze the exact proposal; dispatch waits for a matching decision."""
    rec = draft.rec
    if rec.approval_requests >= draft.ctx.agent.max_approval_requests:
        # Approval fatigue: the agent may not flood reviewers with fresh requests.
        draft.recoverable("approval_limit", refusal(f"{rec.trajectory_id}/ap-", "APPROVAL_LIMIT"))
        draft.end_turn(Cause.REPLY_OBSERVE)
        return
    key = call_key(draft, spec, args, plan_step, 0)
    rec.held = review_request(draft, spec.name, args, plan_step, key)
    draft.move(S.AWAITING_APPROVAL, Cause.REPLY_APPROVAL)
    announce(draft, rec.held)
