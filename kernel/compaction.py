"""Compaction in the step function: the scratchpad's fold as a funded, recorded model call.

At admission (:func:`prepare`), the step just finished joins the scratchpad; if the next view
would pass the profile's cap, the call admitted is a compaction instead of the next step: the
same registration, reservation and ``CallModel`` as any call, its input the steps to fold. Its
reply (:func:`on_summary`) folds them into the summary and returns the run to READY without
counting a stall; a reply that is not a summary is a recoverable error (repeated, it ends the
run like any repeated error). The reply is an ordinary recorded model reply, so replay folds
the same summary again. Agents without a scratchpad pay one attribute test per admission.
"""

from __future__ import annotations

from kernel.context import Draft
from kernel.events import ModelReplied, ReplyStatus
from kernel.lifecycle import Cause
from kernel.record import TrajectoryRecord
from kernel.render import render
from kernel.scratchpad import (
    Scratchpad,
    add_step,
    compaction_view,
    fold,
    steps_to_fold,
)
from kernel.scratchpad import tokens as pad_tokens


def prepare(draft: Draft) -> tuple[str, int, int] | None:
    """Bring the scratchpad up to date before a call; when a compaction is due, its view, the
    number of steps it folds and its output allowance, else None (the next step's view is
    rendered as usual, and always for an agent without a scratchpad)."""
    policy = draft.ctx.agent.scratchpad
    if policy is None:
        return None
    rec = draft.rec
    pad = rec.scratchpad  # the draft's own copy (``TrajectoryRecord.clone``)
    if pad is None:
        pad = rec.scratchpad = Scratchpad()
    pad.compacting = None  # an earlier compaction was either folded or withdrawn
    if pad.proposal is not None:
        step = {"turn": rec.turn, "proposal": pad.proposal, "observation": rec.last_observation}
        add_step(pad, rec.turn, step, draft.ctx.estimator)
        pad.proposal = None
    if policy.max_tokens is None:
        return None
    base = draft.ctx.estimator(render(rec)) - pad_tokens(pad)
    count = steps_to_fold(pad, base, policy)
    if count == 0:
        return None
    cap = min(policy.summary_max_tokens, rec.budget.max_output_tokens)
    return compaction_view(pad, count), count, cap


def mark(rec: TrajectoryRecord, call_id: str, folds: int) -> None:
    """Registering a call: when it folds steps, the scratchpad waits for its summary."""
    if folds and rec.scratchpad is not None:
        rec.scratchpad.compacting, rec.scratchpad.fold_count = call_id, folds


def took_reply(draft: Draft, ev: ModelReplied) -> bool:
    """A current reply of a run with a scratchpad: True when it answered a compaction (and
    was folded); else its proposal waits to join the scratchpad with its observation."""
    pad = draft.rec.scratchpad
    assert pad is not None
    if pad.compacting == ev.call_id:
        on_summary(draft, ev)
        return True
    if ev.status is ReplyStatus.COMPLETED:
        pad.proposal = ev.content
    return False


def on_summary(draft: Draft, ev: ModelReplied) -> None:
    """Fold the compaction's reply into the scratchpad; anything but a summary is observed."""
    rec = draft.rec
    pad = rec.scratchpad
    assert pad is not None
    count, pad.compacting, pad.fold_count = pad.fold_count, None, 0
    content = ev.content if ev.status is ReplyStatus.COMPLETED else None
    text = content.get("text") if isinstance(content, dict) else None
    if isinstance(content, dict) and content.get("type") == "summary" and isinstance(text, str):
        fold(pad, count, text, draft.ctx.estimator)
    else:
        code = "compaction_failed"
        draft.recoverable(code, {"status": "error", "code": code, "reply": ev.status.value})
    draft.end_turn(Cause.REPLY_OBSERVE, counts_as_step=False)
