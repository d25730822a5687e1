"""A reviewer's decision or an operator's control on a run of the embedded store.

A run that the embedded runner left suspended (held for approval, paused) goes on here from its
stored record alone: the event is stepped on the record as loaded, committed by compare-and-set
on that version, and the runner carries out what the kernel then asks, to the run's end or its
next suspension. Before that, a decision must name the request the record holds and find it
still held: a repeated decision, or one for another request, is refused and changes nothing,
so an approval cannot be replayed. A refusal of the kernel's on the first step (an illegal
control, a reviewer the agent does not know) or a lost compare-and-set changes nothing either.

The embedded runner's clock is simulated: the run carries on from its last chain row's reading.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from kernel.context import KernelContext
from kernel.errors import ControlFlow, InvalidInput
from kernel.events import ControlRequested, Event
from kernel.record import ApprovalStatus, ControlKind, HeldProposal, TrajectoryRecord
from kernel.states import LifecycleState
from kernel.tools import ToolBackend
from store.base import TrajectoryStore
from worker.embedded import Clock, EmbeddedRunner, RunResult, decision_on
from worker.models import Model
from worker.resume import stored_runner


class DecisionRefused(InvalidInput):
    """A decision on a request the trajectory does not hold now; nothing was changed."""

    code = "decision_refused"


def reading(store: TrajectoryStore, rec: TrajectoryRecord) -> float:
    """Where the run's simulated clock stopped: its last chain row's time (never before the
    time the record has accounted as active)."""
    last = store.last_row(rec.tenant, rec.trajectory_id)
    return max(last.at if last is not None else rec.submitted_at, rec.active_s)


def runner_for(
    store: TrajectoryStore,
    rec: TrajectoryRecord,
    ctx: KernelContext,
    model: Model,
    backend: ToolBackend,
    bind: Callable[[TrajectoryRecord], ToolBackend] | None = None,
) -> EmbeddedRunner:
    """A runner committing to ``store``, its clock where ``rec``'s run stopped."""
    return stored_runner(store, ctx, model, backend, Clock(reading(store, rec)), bind=bind)


def held_request(rec: TrajectoryRecord, approval_id: str | None = None) -> HeldProposal:
    """The request ``rec`` holds for a decision now (and it is ``approval_id``, when one is
    named); :class:`DecisionRefused` saying what is wrong otherwise."""
    held, tid = rec.held, rec.trajectory_id
    if held is None:
        raise DecisionRefused(
            f"{tid} has never held an approval (it is {rec.state.value})", field="trajectory_id"
        )
    if approval_id is not None and approval_id != held.approval_id:
        raise DecisionRefused(
            f"{tid} does not hold approval {approval_id}: its request is {held.approval_id} "
            f"({held.status.value})",
            field="approval_id",
        )
    # An approved request admission refused stays held: approving it again re-checks it (the
    # embedded store has no ticker to do so).
    open_ = held.status in (ApprovalStatus.HELD, ApprovalStatus.APPROVED)
    if not open_ or rec.state is not LifecycleState.AWAITING_APPROVAL:
        raise DecisionRefused(
            f"approval {held.approval_id} of {tid} is {held.status.value}, not held (the run is "
            f"{rec.state.value}): it was decided once and is not decided again",
            code="approval_closed",
            field="approval_id",
        )
    return held


def decide(
    runner: EmbeddedRunner,
    rec: TrajectoryRecord,
    *,
    approve: bool,
    reviewer: str,
    approval_id: str | None = None,
    comment: str = "",
) -> RunResult:
    """Approve or deny the request ``rec`` holds, as ``reviewer``, and run on."""
    held = held_request(rec, approval_id)
    decision = decision_on(held, runner.clock.now(), reviewer, approve, comment)
    return _run_on(runner, rec, decision)


def control(
    runner: EmbeddedRunner, rec: TrajectoryRecord, kind: ControlKind, requested_by: str
) -> RunResult:
    """Deliver one control request, and run on as far as the kernel then asks."""
    request = ControlRequested(
        now=runner.clock.now(),
        kind=kind,
        request_id=f"ctl-{uuid.uuid4().hex[:12]}",
        requested_by=requested_by,
    )
    return _run_on(runner, rec, request)


def _run_on(runner: EmbeddedRunner, rec: TrajectoryRecord, event: Event) -> RunResult:
    try:
        return runner.run(rec, event)
    except ControlFlow as exc:
        if runner.last is not None:  # a later step's: what came before it is committed
            raise
        raise InvalidInput(
            f"{rec.trajectory_id} ({rec.state.value}, version {rec.record_version}): {exc}; "
            "nothing was changed",
            code=exc.code,
            field=exc.field,
        ) from None
