"""Supervised waiting: when a wait on tool results ends (seed 004 section 10.6).

A wait ends when its declared policy is met (all results, or enough partial results), when its
own deadline passes, or when it is explicitly withdrawn. Ending a wait withdraws the claim on
the results still missing (their eligibility, and the epoch moves on), never their obligation:
each keeps its reservation and owner until evidence settles it.
"""

from __future__ import annotations

from kernel.agent import WaitKind
from kernel.context import Draft
from kernel.lifecycle import Cause
from kernel.record import Operation, OpKind
from kernel.states import LifecycleState


def open_batch(draft: Draft) -> list[Operation]:
    """Tool calls of the current wait whose results are still expected."""
    return [op for op in draft.rec.operations.values() if op.kind is OpKind.TOOL and op.eligible]


def _withdraw(draft: Draft, missing: list[Operation], code: str) -> None:
    rec = draft.rec
    for op in missing:
        op.eligible = False
    rec.control_epoch += 1
    ids = sorted(op.call_id for op in missing)
    draft.observe({"status": "partial", "code": code, "missing": ids, "last": rec.last_observation})


def after_result(draft: Draft) -> None:
    """Apply the wait policy after an eligible result was staged."""
    rec, policy = draft.rec, draft.ctx.agent.wait
    missing = open_batch(draft)
    if not missing:
        rec.wait_deadline = None
        draft.end_turn(Cause.WAIT_SATISFIED)
        return
    cancelling = rec.pending_control is not None  # a cancel waits for every result
    if policy.kind is WaitKind.PARTIAL and not cancelling and arrived(draft) >= policy.min_results:
        _withdraw(draft, missing, "partial_results")
        rec.wait_deadline = None
        draft.end_turn(Cause.WAIT_SATISFIED)


def on_deadline(draft: Draft) -> None:
    """The wait's deadline passed: stop waiting; what is missing stays owed, not refunded."""
    rec = draft.rec
    if rec.state is not LifecycleState.WAITING_TOOL:
        return
    _withdraw(draft, open_batch(draft), "wait_deadline")
    rec.wait_deadline = None
    draft.end_turn(Cause.WITHDRAWN)


def arrived(draft: Draft) -> int:
    """Results of this turn's batch that have arrived (settled evidence, current epoch)."""
    rec = draft.rec
    return sum(
        1
        for op in rec.operations.values()
        if op.kind is OpKind.TOOL
        and op.turn == rec.turn
        and op.epoch == rec.control_epoch
        and op.evidence is not None
    )
