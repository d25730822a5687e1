"""The step function: one event in, a new record and the commands to carry out.

``step(record, event, ctx)`` is pure: the clock reading comes in the event, ids are derived
from the record's own counters, and the token estimator is injected through ``ctx``. It never
mutates its input; the record it returns is a new value. The embedded runner, the Celery
worker, replay and the property tests all drive this one function.

Bad input (an event naming an unknown call, attempt, approval or a state it cannot apply to)
raises an error from :mod:`kernel.errors` and changes nothing. A duplicate of evidence already
recorded returns the record unchanged with no commands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel import backpressure, control, fold, owed, policy_holds, recovery, results, tool_jobs
from kernel.admission import admit
from kernel.context import Draft, KernelContext, StepResult
from kernel.errors import IllegalTransition
from kernel.events import (
    Admit,
    ApprovalDecided,
    ControlRequested,
    Event,
    Finalize,
    GrantsChanged,
    InputGiven,
    JobReported,
    JobStarted,
    ModelReplied,
    Reconcile,
    Recover,
    Tick,
    ToolDeferred,
    ToolProgress,
    ToolResulted,
)
from kernel.record import ApprovalStatus, TrajectoryRecord
from kernel.states import LifecycleState

S = LifecycleState


def finalize(draft: Draft, ev: Finalize) -> None:
    """End the run for a reason the runtime decided; only from a state where nothing the
    kernel admitted is left to act (READY, PAUSED, AWAITING_APPROVAL); a refusal otherwise."""
    rec = draft.rec
    if rec.state not in (S.READY, S.PAUSED, S.AWAITING_APPROVAL):
        raise IllegalTransition(
            rec.state.value,
            S.FINALIZING.value,
            "finalize",
            "finalize a trajectory only between turns",
        )
    if rec.held is not None and (
        rec.held.status is ApprovalStatus.HELD or control.approved_not_admitted(rec)
    ):
        rec.held.status = ApprovalStatus.WITHDRAWN
        rec.held.decided_at = draft.now
    rec.pending_control = None
    draft.stop(ev.stop, ev.detail or None)


Handler = Callable[[Draft, Any], None]

#: The handler of each event type.
HANDLERS: dict[type[Event], Handler] = {
    Admit: lambda draft, ev: admit(draft),
    ModelReplied: fold.on_model_reply,
    ToolResulted: results.on_tool_result,
    ToolDeferred: backpressure.on_tool_deferred,
    ApprovalDecided: control.on_approval,
    ControlRequested: control.on_control,
    GrantsChanged: policy_holds.on_grants,
    Tick: lambda draft, ev: control.on_tick(draft),
    ToolProgress: control.on_progress,
    JobStarted: tool_jobs.on_started,
    JobReported: tool_jobs.on_report,
    InputGiven: tool_jobs.on_input,
    Finalize: finalize,
    Recover: lambda draft, ev: recovery.on_recover(draft),
    Reconcile: lambda draft, ev: owed.on_reconcile(draft),
}


def step(rec: TrajectoryRecord, event: Event, ctx: KernelContext) -> StepResult:
    """Apply one event to a record; see the module docstring for the contract."""
    handler = HANDLERS.get(type(event))
    if handler is None:  # pragma: no cover - the union is closed
        raise TypeError(f"not an event: {event!r}")
    draft = Draft(rec, ctx, event.now)
    handler(draft, event)
    if not draft.rows and not draft.commands and draft.quarantined is None:
        # Nothing happened: return the caller's record untouched, so no version is spent.
        return StepResult(rec, note=draft.note, ack=draft.ack)
    if draft.rec.record_version == rec.record_version:
        draft.rec.record_version += 1  # every committed change is a new version
    return draft.result()
