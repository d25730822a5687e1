"""Folding model replies into the record (tool results are in :mod:`kernel.results`).

Every authentic result settles; only a result whose call is still eligible, registered under
the current control epoch, reaches the model's view (seed 004 listing 2). Only a COMPLETED
reply can become a proposal (table 4); anything else is an observation or diagnostics.
"""

from __future__ import annotations

from typing import Any

from kernel import shapes
from kernel.amounts import (
    NOTHING,
    ZERO,
    Dimension,
    model_call_charge,
    tool_call_liability,
)
from kernel.chain import RowKind
from kernel.errors import AdmissionRefused, IllegalTransition, UnknownReference
from kernel.events import DispatchTool, HoldForApproval, ModelReplied, ReplyStatus
from kernel.fastmodel import construct
from kernel.lifecycle import Cause, transition
from kernel.plan import adopt, open_steps, validate_plan
from kernel.progress import digest, fingerprint
from kernel.record import HeldProposal, Operation, OpKind, OpStatus
from kernel.states import LifecycleState, StopReason
from kernel.step import MISFIT_STOP, Turn
from kernel.tools import ToolSpec

S = LifecycleState


# --- model replies ---------------------------------------------------------------------------


def on_model_reply(turn: Turn, ev: ModelReplied) -> None:
    """Settle the call, then route the reply by its status and content."""
    rec = turn.rec
    op = rec.operations.get(ev.call_id)
    if op is None or op.kind is not OpKind.MODEL:
        raise UnknownReference(f"trajectory {rec.trajectory_id}: no model call {ev.call_id}")
    if op.evidence is not None:
        turn.note = f"duplicate reply for {ev.call_id}: already settled"
        return
    turn.spend_time(ev.latency_s)
    attempt = op.attempts[-1]
    # The proposal itself goes to the chain; the record keeps only what decisions need,
    # plus the raw text of any reply that did not complete, for diagnostics.
    op.evidence = {"status": ev.status.value}
    if ev.status is not ReplyStatus.COMPLETED and ev.raw is not None:
        op.evidence["raw"] = ev.raw
    if ev.usage is not None:
        rec.ledger.book(attempt, model_call_charge(turn.ctx.agent.model.price, ev.usage))
        op.status = OpStatus.SETTLED
    else:
        op.status = OpStatus.UNKNOWN  # no usage evidence: the reservation stays
    usage = ev.usage
    turn.row(
        RowKind.MODEL,
        call_id=ev.call_id,
        outcome=ev.status.value,
        tokens_in=(usage.uncached_input + usage.cached_input) if usage else 0,
        tokens_out=usage.output if usage else 0,
        duration_s=ev.latency_s,
        detail={"proposal": ev.content, "timed_out": ev.timed_out},
    )
    current = rec.state is S.CALLING_MODEL and op.eligible and op.epoch == rec.control_epoch
    if not current:
        # The reply outlived its claim (pause, interrupt, cancel): settled, kept as diagnostics.
        turn.quarantined = IllegalTransition(
            rec.state.value, "WAITING_TOOL", ev.call_id, "reply is no longer eligible"
        )
        op.evidence["quarantined"] = True
        if ev.raw is not None:
            op.evidence["raw"] = ev.raw
        op.eligible = False
        return
    op.eligible = False
    if ev.timed_out or rec.active_s >= rec.budget.deadline_s:
        turn.stop(StopReason.DEADLINE)
        return
    if ev.status is not ReplyStatus.COMPLETED:
        kind = ev.status.value.lower()
        obs: dict[str, Any] = {"status": "error", "code": f"reply_{kind}"}
        if ev.retry_after_s is not None:
            obs["retry_after_s"] = ev.retry_after_s
        turn.recoverable(f"reply_{kind}", obs)
        turn.end_turn(Cause.REPLY_OBSERVE)
        return
    _route_proposal(turn, ev.content)


def _route_proposal(turn: Turn, content: Any) -> None:
    kind = content.get("type") if isinstance(content, dict) else None
    if kind == "final":
        _on_final(turn, content)
    elif kind == "plan":
        _on_plan(turn, content.get("steps"))
    elif kind == "tool":
        _on_tools(turn, [content])
    elif kind == "tools" and isinstance(content.get("calls"), list):
        _on_tools(turn, content["calls"])
    else:
        what = "not an object" if not isinstance(content, dict) else f"unknown type {kind!r}"
        turn.recoverable(
            "malformed_reply", {"status": "error", "code": "malformed_reply", "detail": what}
        )
        turn.end_turn(Cause.REPLY_OBSERVE)


def _on_final(turn: Turn, content: dict[str, Any]) -> None:
    rec = turn.rec
    outcome = content.get("outcome")
    pending = open_steps(rec.plan)
    if outcome == "completed" and pending:
        turn.recoverable(
            "plan_incomplete", {"status": "error", "code": "plan_incomplete", "detail": pending}
        )
        turn.end_turn(Cause.REPLY_OBSERVE)
        return
    if outcome == "completed":
        check = turn.ctx.agent.acceptance
        reason = check(rec) if check is not None else None
        if reason is not None:
            turn.stop(StopReason.FAILED, f"acceptance check failed: {reason}")
            return
        turn.stop(StopReason.DONE)
    else:
        turn.stop(StopReason.FAILED, f"agent reported {outcome!r}")


def _on_plan(turn: Turn, steps: Any) -> None:
    rec = turn.rec
    budget = rec.budget
    replanning = bool(rec.plan)
    executing = shapes.executes_plans(turn)
    if replanning and rec.plan_revision - 1 >= budget.max_replans:
        problems = ["a plan is already set"]
    else:
        problems = validate_plan(steps, turn.ctx.agent.catalog, budget.max_plan_steps)
        if executing and not problems:
            problems = shapes.reference_problems(steps)
    if problems:
        turn.recoverable(
            "invalid_plan", {"status": "error", "code": "invalid_plan", "detail": problems}
        )
    else:
        rec.plan = adopt(steps)
        rec.plan_revision += 1
        if replanning:
            # A revision withdraws the claim of everything proposed under the old plan.
            rec.control_epoch += 1
        turn.clear_error_streak()
        turn.observe({"status": "ok", "code": "plan_accepted", "steps": len(rec.plan)})
        if executing:
            shapes.advance(turn)  # the kernel runs the plan; the model is not called per step
            return
    turn.end_turn(Cause.REPLY_OBSERVE)


def _on_tools(turn: Turn, calls: list[Any]) -> None:
    """Validate each proposed call, then hold, dispatch, or observe; never dispatch twice."""
    rec, agent = turn.rec, turn.ctx.agent
    admitted: list[Call] = []
    for call in calls:
        if len(admitted) >= rec.budget.max_fanout:
            break
        name = call.get("name") if isinstance(call, dict) else None
        args = call.get("args") if isinstance(call, dict) else None
        plan_step = call.get("plan_step") if isinstance(call, dict) else None
        fp = fingerprint(str(name), args)
        rec.seen[fp] = rec.seen.get(fp, 0) + 1
        if rec.seen[fp] > rec.budget.max_repeat:
            turn.stop(StopReason.REPEATED_CALL, f"{name} proposed {rec.seen[fp]} times")
            return
        spec = agent.catalog.get(name) if isinstance(name, str) else None
        if spec is None:
            turn.recoverable(
                "unknown_tool", {"status": "error", "code": "unknown_tool", "tool": str(name)}
            )
            continue
        clean, why = spec.validate_args(args)
        if clean is None:
            turn.recoverable(
                "schema_violation", {"status": "error", "code": "schema_violation", "detail": why}
            )
            continue
        if not isinstance(plan_step, str) or not any(s.id == plan_step for s in rec.plan):
            plan_step = None
        if not spec.permitted(rec.grants, clean):
            turn.stop(StopReason.FAILED, f"policy denial: {spec.name} is not granted")
            return
        if spec.liability is None:
            turn.stop(StopReason.FAILED, f"policy denial: {spec.name} has no finite liability")
            return
        if spec.needs_approval(clean):
            _hold(turn, spec, clean, plan_step)
            return
        admitted.append((spec, clean, plan_step))
    if not admitted:
        turn.end_turn(Cause.REPLY_OBSERVE)
        return
    dispatch(turn, admitted, Cause.REPLY_TOOLS)


def call_key(turn: Turn, plan_step: str | None, index: int) -> str:
    """One key per logical step: a repeated plan step is the same effect, not a new one."""
    rec = turn.rec
    if plan_step is not None:
        return f"{rec.trajectory_id}:{plan_step}"
    suffix = f".{index}" if index else ""
    return f"{rec.trajectory_id}:adhoc{rec.turn}{suffix}"


def refusal(approval_id: str, reason: str) -> dict[str, Any]:
    """The observation a withheld action returns to the model (seed 004 section 10.7.2)."""
    return {
        "approval_id": approval_id,
        "status": "REFUSED",
        "reason": reason,
        "dispatch_status": "not_sent",
    }


def _hold(turn: Turn, spec: ToolSpec, args: dict[str, Any], plan_step: str | None) -> None:
    """Approval escrow: freeze the exact proposal; dispatch waits for a matching decision."""
    rec = turn.rec
    if rec.approval_requests >= turn.ctx.agent.max_approval_requests:
        # Approval fatigue: the agent may not flood reviewers with fresh requests.
        turn.recoverable("approval_limit", refusal(f"{rec.trajectory_id}/ap-", "APPROVAL_LIMIT"))
        turn.end_turn(Cause.REPLY_OBSERVE)
        return
    rec.approval_requests += 1
    approval_id = f"{rec.trajectory_id}/ap{rec.approval_requests}"
    key = call_key(turn, plan_step, 0)
    proposal = {
        "operation": spec.name,
        "arguments": args,
        "target": key,
        "plan_revision": rec.plan_revision,
    }
    held = HeldProposal(
        approval_id=approval_id,
        held_version=rec.record_version + 1,  # the version the hold commits at
        plan_revision=rec.plan_revision,
        expires_at=turn.now + turn.ctx.agent.approval_ttl_s,
        held_at=turn.now,
        digest=digest(proposal, size=32),
        tool=spec.name,
        args=args,
        plan_step=plan_step,
        call_key=key,
    )
    rec.held = held
    turn.move(S.AWAITING_APPROVAL, Cause.REPLY_APPROVAL)
    turn.row(
        RowKind.APPROVAL,
        tool=spec.name,
        args=args,
        outcome="held",
        detail={"approval_id": approval_id, "digest": held.digest},
    )
    turn.commands.append(
        HoldForApproval(
            approval_id=approval_id,
            held_version=held.held_version,
            digest=held.digest,
            tool=spec.name,
            args=args,
            expires_at=held.expires_at,
        )
    )


Call = tuple[ToolSpec, dict[str, Any], str | None]


def dispatch(
    turn: Turn,
    calls: list[Call],
    cause: Cause | None,
    approval_digest: str | None = None,
    keys: list[str] | None = None,
) -> None:
    """Register and reserve every call, take the edge to WAITING_TOOL (or stay there when
    ``cause`` is None: a plan's next steps), then emit the dispatches. A batch that does not
    fit the budget registers nothing and ends the run with the matching stop.
    """
    rec = turn.rec
    planned: list[Operation] = []
    tool_ops = sum(1 for op in rec.operations.values() if op.kind is OpKind.TOOL)
    for j, (spec, args, plan_step) in enumerate(calls):
        call_id = f"{rec.trajectory_id}/t{tool_ops + j + 1}"
        planned.append(
            construct(
                Operation,
                op_id=call_id,
                call_id=call_id,
                kind=OpKind.TOOL,
                attempts=[f"{call_id}/a1"],
                idempotency_key=keys[j] if keys else call_key(turn, plan_step, j),
                epoch=rec.control_epoch,
                reservation=tool_call_liability(spec.liability or ZERO),
                tool=spec.name,
                args=args,
                plan_step=plan_step,
                turn=rec.turn,
            )
        )

    def register(r: Any) -> None:
        done: list[str] = []
        try:
            for op in planned:
                r.ledger.admit(op.attempts[0], op.reservation)
                done.append(op.attempts[0])
        except AdmissionRefused:
            for attempt in done:  # not sent: nothing left the process, so nothing is owed
                r.ledger.book(attempt, NOTHING)
            raise
        for op in planned:
            r.operations[op.op_id] = op
        r.tool_dispatches += len(planned)

    try:
        if cause is None:
            register(rec)
        else:
            transition(rec, S.WAITING_TOOL, turn.decide(cause), turn.now, admit=register)
    except AdmissionRefused as refused:
        turn.stop(MISFIT_STOP[Dimension(refused.dimension)])
        return
    wait_s = turn.ctx.agent.wait.deadline_s
    if cause is not None and wait_s is not None:
        rec.wait_deadline = turn.now + wait_s
    timeout = round(rec.budget.deadline_s - rec.active_s, 6)
    for op, (spec, _args, _step) in zip(planned, calls, strict=True):
        turn.commands.append(
            construct(
                DispatchTool,
                call_id=op.call_id,
                attempt_id=op.attempts[0],
                tool=spec.name,
                args=op.args or {},
                idempotency_key=op.idempotency_key,
                timeout_s=min(spec.timeout_s, timeout),
                approval_digest=approval_digest,
            )
        )
