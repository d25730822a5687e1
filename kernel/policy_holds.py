"""Operators' grants and freezes at the dispatch boundary: refuse, hold, and release.

A proposed call :func:`kernel.authority.barrier` stops is either refused to the model as a
policy result (:func:`refuse`) or held, not sent (:func:`hold`): the exact call waits in the
record as a held proposal whose ``reason`` names the freeze or the read-only grant, in
AWAITING_APPROVAL, where the wall clock still runs. Every tick and every change of the
trajectory's grants re-checks it (:func:`recheck`); once nothing holds it any more it is sent
under the key it was held with, or handed to a reviewer when its tool asks for one. Each
decision is a row of the chain.
"""

from __future__ import annotations

from typing import Any

from kernel.authority import Barrier, barrier
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.dispatch import announce, call_key, dispatch, review_request
from kernel.errors import IllegalTransition
from kernel.events import GrantsChanged
from kernel.lifecycle import Cause
from kernel.progress import digest
from kernel.record import ApprovalStatus, EscalationStage, HeldProposal, HoldReason
from kernel.states import LIVE, LifecycleState
from kernel.tools import ToolSpec

S = LifecycleState


def policy_result(spec: ToolSpec, bar: Barrier) -> dict[str, Any]:
    """The observation a call refused by the operators' grants returns to the model."""
    return {
        "status": "error",
        "code": "policy_denied",
        "tool": spec.name,
        "reason": bar.code,
        "detail": bar.detail,
        "dispatch_status": "not_sent",
    }


def refuse(draft: Draft, spec: ToolSpec, args: dict[str, Any], bar: Barrier) -> None:
    """Refuse the call to the model as a policy result; the chain records the refusal."""
    draft.row(RowKind.TOOL, tool=spec.name, args=args, outcome="policy_denied", error=bar.detail)
    draft.recoverable("policy_denied", policy_result(spec, bar))


def hold(
    draft: Draft, spec: ToolSpec, args: dict[str, Any], plan_step: str | None, bar: Barrier
) -> None:
    """Hold the exact call, not sent, until the freeze or read-only grant is lifted; it waits
    no longer than the run's wall clock."""
    rec = draft.rec
    assert bar.reason is not None
    key = call_key(draft, spec, args, plan_step, 0)
    rec.held = HeldProposal(
        approval_id=f"{rec.trajectory_id}/hold{rec.chain_length}",
        held_version=rec.record_version + 1,
        plan_revision=rec.plan_revision,
        expires_at=rec.submitted_at + rec.budget.wall_clock_s,
        held_at=draft.now,
        digest=digest({"operation": spec.name, "arguments": args, "target": key}, size=32),
        tool=spec.name,
        args=args,
        plan_step=plan_step,
        call_key=key,
        reason=bar.reason,
    )
    draft.move(S.AWAITING_APPROVAL, Cause.REPLY_APPROVAL)
    draft.row(
        RowKind.APPROVAL,
        tool=spec.name,
        args=args,
        outcome=f"held_{bar.reason.value}",
        error=bar.detail,
        detail={"approval_id": rec.held.approval_id, "reason": bar.reason.value},
    )


def recheck(draft: Draft) -> bool:
    """Re-check a call held by a freeze or a read-only grant; True if it moved (sent, handed
    to a reviewer, or refused because the grants no longer allow it at all)."""
    rec = draft.rec
    held = rec.held
    if (
        rec.state is not S.AWAITING_APPROVAL
        or held is None
        or held.status is not ApprovalStatus.HELD
        or held.reason is HoldReason.APPROVAL
        or rec.pending_control is not None
    ):
        return False
    spec = draft.ctx.agent.catalog.get(held.tool)
    assert spec is not None  # the catalog is fixed for a run
    bar = barrier(rec, draft.ctx.authority_of(rec.tenant), spec, held.args)
    if bar is not None and bar.hold:
        if bar.reason is not held.reason:  # the freeze lifted, a read-only grant stands
            held.reason = bar.reason or held.reason
            draft.row(RowKind.APPROVAL, tool=held.tool, outcome=f"held_{held.reason.value}")
        return False
    held.status = ApprovalStatus.WITHDRAWN if bar is not None else ApprovalStatus.APPROVED
    held.decided_at = draft.now
    if bar is not None:
        refuse(draft, spec, held.args, bar)
        draft.end_turn(Cause.WITHDRAWN)
        return True
    detail = {"approval_id": held.approval_id, "reason": held.reason.value}
    if spec.needs_approval(held.args):
        draft.row(RowKind.APPROVAL, tool=held.tool, outcome="released_for_review", detail=detail)
        _for_review(draft, held)
        return True
    draft.row(RowKind.APPROVAL, tool=held.tool, outcome="released", detail=detail)
    dispatch(draft, [(spec, held.args, held.plan_step)], Cause.RELEASED, keys=[held.call_key])
    return True


def _for_review(draft: Draft, was: HeldProposal) -> None:
    """The released call's tool asks for a reviewer: it is held again, now for approval."""
    held = review_request(draft, was.tool, was.args, was.plan_step, was.call_key)
    draft.rec.held = held
    announce(draft, held)


def on_grants(draft: Draft, ev: GrantsChanged) -> None:
    """An operator sets the trajectory's grants or its freeze; a held call is re-checked at
    once. Staged escalation's read-only restriction stays whatever the grants say."""
    rec = draft.rec
    if rec.state not in LIVE:
        raise IllegalTransition(rec.state.value, "grants", ev.request_id, "run has ended")
    new = rec.grants
    if ev.grants is not None:
        new = ev.grants.model_copy(update={"frozen": new.frozen})
    if ev.frozen is not None:
        new = new.model_copy(update={"frozen": ev.frozen})
    if rec.escalation is EscalationStage.RESTRICT:
        new = new.model_copy(update={"read_only": True})
    if new == rec.grants:
        draft.note = "grants unchanged"
        return
    rec.grants = new
    draft.row(
        RowKind.CONTROL,
        outcome="grants",
        detail={
            "request_id": ev.request_id,
            "by": ev.requested_by,
            "grants": new.model_dump(mode="json"),
        },
    )
    recheck(draft)
