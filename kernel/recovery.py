"""Recovery: the worker that held a turn is gone; carry on from the record alone.

The record says which operations were in flight. None of them is assumed to have failed or
to have succeeded: a model call that may have been sent keeps its reservation until evidence
settles it, and its claim on the turn is withdrawn (the epoch moves on), so a late reply can
settle but never act. A tool call that may have been sent is resolved as its tool declares:
a read is sent again under the same key, a write is re-sent (the backend deduplicates by key),
looked up, or ends the run ``unknown_outcome``. So every effect happens at most once per key.
"""

from __future__ import annotations

from kernel import finalizing, tool_job_polls
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.control import abandon_closing
from kernel.events import Enqueue
from kernel.lifecycle import Cause
from kernel.record import OpKind, OpStatus
from kernel.results import resolve_unknown
from kernel.states import LifecycleState

S = LifecycleState


def on_recover(draft: Draft) -> None:
    """Resume a trajectory whose turn was stranded on a dead worker."""
    rec = draft.rec
    if rec.state is S.READY:
        draft.commands.append(Enqueue())  # the queue may have lost it with the worker
        draft.note = "recovered: re-queued"
        return
    if rec.state is S.CALLING_MODEL:
        for op in rec.operations.values():
            if op.kind is OpKind.MODEL and op.eligible:
                op.eligible = False
                op.status = OpStatus.UNKNOWN  # may have been sent: the reservation stays
        rec.control_epoch += 1
        rec.recoveries += 1
        detail = {"state": "CALLING_MODEL", "recoveries": rec.recoveries}
        draft.row(RowKind.CONTROL, outcome="recovered", detail=detail)
        # The fleet's fault, not the agent's: no step, so no stall (MAX_RECOVERIES bounds it).
        draft.end_turn(Cause.WITHDRAWN, counts_as_step=False)
        return
    if rec.state is S.WAITING_TOOL:
        _recover_wait(draft)
        return
    if finalizing.awaiting(rec):
        draft.row(RowKind.CONTROL, outcome="recovered", detail={"state": "FINALIZING"})
        abandon_closing(draft, "its worker was lost during the closing call")
        return
    draft.note = f"nothing in flight to recover in {rec.state.value}"


def _recover_wait(draft: Draft) -> None:
    """A wait whose worker is gone: each call still awaited is resolved as its tool declares."""
    rec = draft.rec
    rec.recoveries += 1
    detail = {"state": "WAITING_TOOL", "recoveries": rec.recoveries}
    draft.row(RowKind.CONTROL, outcome="recovered", detail=detail)
    for op in list(rec.operations.values()):
        if op.kind is not OpKind.TOOL or not op.eligible or not op.open:
            continue
        spec = draft.ctx.agent.catalog.get(op.tool or "")
        if spec is None:  # pragma: no cover - the catalog is fixed for a run
            continue
        if op.job is not None:
            tool_job_polls.recover(draft, op, spec)
            continue
        resolve_unknown(draft, op, spec)
        if rec.state is not S.WAITING_TOOL:
            return  # the rule ended the run (unknown_outcome, or a budget)
