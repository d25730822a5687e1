"""When a job is polled, when it is past its deadline, and how it is asked to stop.

A runner never decides to poll on its own: a :class:`~kernel.events.Tick` at or after
:func:`next_due` makes the kernel record the poll (its count, the next due time, backed off
and bounded by the policy) and emit :class:`~kernel.events.PollJob`, so polling never wakes
the model and a poll's repeated answer changes nothing. A job still running at its deadline is
asked to stop, its outcome becomes unknown (the reservation stays until its report), and a
run waiting on it stops with the deadline's reason.
"""

from __future__ import annotations

from typing import Any, TypeVar

from kernel.context import Draft
from kernel.events import CancelJob, GiveInput, PollJob, StartJob
from kernel.fastmodel import construct
from kernel.job_specs import FINAL, JobPolicy, JobState, JobStatus, micros
from kernel.record import Operation, OpStatus, TrajectoryRecord
from kernel.states import LIVE, LifecycleState, StopReason
from kernel.tools import ToolSpec

C = TypeVar("C", PollJob, CancelJob, GiveInput)

S = LifecycleState


def policy_of(draft: Draft, op: Operation) -> JobPolicy:
    """The job policy of ``op``'s tool (the default policy if the catalog lost it)."""
    spec = draft.ctx.agent.catalog.get(op.tool or "")
    return spec.job if spec is not None and spec.job is not None else JobPolicy()


def open_jobs(rec: TrajectoryRecord) -> list[Operation]:
    """Job operations that still owe a report or a bill, in registration order."""
    return [op for op in rec.operations.values() if op.job is not None and op.open]


def update(op: Operation, **changes: object) -> JobState:
    """Replace ``op``'s job state with a changed copy (versions share the old one); a time
    is given in seconds as ``next_poll_at`` or ``cancel_at``."""
    assert op.job is not None
    for name, stored in (("next_poll_at", "next_poll_us"), ("cancel_at", "cancel_us")):
        if name in changes:
            at = changes.pop(name)
            changes[stored] = None if at is None else micros(float(at))  # type: ignore[arg-type]
    job = op.job.model_copy(update=changes)
    op.job = job
    return job


def start(
    draft: Draft, op: Operation, spec: ToolSpec, timeout_s: float, digest: str | None
) -> StartJob:
    """The start of a registered job: its job state (deadline from its timeout, cut to the
    wall clock) and the command. Nothing is polled before the start's answer names a handle."""
    rec = draft.rec
    wall_left = rec.submitted_at + rec.budget.wall_clock_s - draft.now
    deadline = draft.now + max(min(spec.timeout_s, wall_left), 0.0)
    op.job = construct(JobState, started_us=micros(draft.now), deadline_us=micros(deadline))
    return _start_command(draft, op, spec, timeout_s, digest)


def _start_command(
    draft: Draft, op: Operation, spec: ToolSpec, timeout_s: float, digest: str | None
) -> StartJob:
    """The command that starts ``op``'s job, under its key and latest attempt."""
    return construct(
        StartJob,
        call_id=op.call_id,
        attempt_id=op.attempts[-1],
        tool=spec.name,
        args=op.args or {},
        idempotency_key=op.idempotency_key,
        timeout_s=timeout_s,
        epoch=op.epoch,
        approval_digest=digest,
        fence=draft.fence,
    )


def job_command(kind: type[C], op: Operation, **fields: Any) -> C:
    """A command about ``op``'s started job: its call, latest attempt and handle."""
    job = op.job
    assert job is not None
    return construct(
        kind, call_id=op.call_id, attempt_id=op.attempts[-1], handle=job.handle, **fields
    )


def recover(draft: Draft, op: Operation, spec: ToolSpec) -> None:
    """A job whose worker is gone: a started job is polled at once (it runs on elsewhere);
    one whose start was never answered is started again under the same key and attempt,
    which the backend's start deduplicates (never a second job)."""
    job = op.job
    assert job is not None
    if job.handle is not None:
        update(op, next_poll_at=draft.now)
        return
    draft.commands.append(_start_command(draft, op, spec, max(job.deadline - draft.now, 0.0), None))


def schedule(draft: Draft, op: Operation, polls: int) -> float | None:
    """The next poll after ``polls`` polls: backed off, bounded by the policy's ceiling and,
    while the deadline is ahead, by the deadline; None once ``max_polls`` were made."""
    job = op.job
    assert job is not None
    policy = policy_of(draft, op)
    if polls >= policy.max_polls:
        return None
    at = draft.now + policy.interval(polls)
    if draft.now < job.deadline:
        at = min(at, job.deadline)
    return at


def polls_due(draft: Draft) -> None:
    """Record and emit a poll for every job whose poll is due (any state: a job of an ended
    run still owes its bill)."""
    for op in open_jobs(draft.rec):
        job = op.job
        assert job is not None
        if job.handle is None or job.next_poll_at is None or draft.now < job.next_poll_at:
            continue
        polls = job.polls + 1
        update(op, polls=polls, next_poll_at=schedule(draft, op, polls))
        draft.commands.append(job_command(PollJob, op, epoch=op.epoch))


def cancel(draft: Draft, op: Operation) -> None:
    """Ask the backend to stop ``op``'s job, once; its report still settles it. A job whose
    result is in (only its bill owed) has nothing left to stop."""
    job = op.job
    assert job is not None
    if job.cancel_requested or job.status in FINAL:
        return
    update(op, cancel_at=draft.now)
    draft.commands.append(
        job_command(CancelJob, op, idempotency_key=op.idempotency_key, tool=op.tool or "")
    )


def past_deadline(draft: Draft) -> bool:
    """Cancel every job still running past its deadline (outcome unknown, reservation kept);
    a run waiting on one of them stops ``deadline``. True if the run stopped."""
    rec = draft.rec
    late = [
        op
        for op in open_jobs(rec)
        if op.job is not None
        and op.job.status not in FINAL
        and not op.job.cancel_requested
        and draft.now >= op.job.deadline
    ]
    if not late:
        return False
    awaited = [op.call_id for op in late if op.eligible]
    for op in late:
        cancel(draft, op)
        op.eligible = False
        op.status = OpStatus.UNKNOWN  # it may still finish and bill: never assumed either way
    if rec.state is S.WAITING_TOOL and awaited:
        rec.wait_deadline = None
        draft.stop(StopReason.DEADLINE, f"job {', '.join(awaited)} ran past its deadline")
        return True
    draft.note = f"jobs past their deadline asked to stop: {[op.call_id for op in late]}"
    return False


def next_due(rec: TrajectoryRecord) -> float | None:
    """When a runner should next deliver a Tick for this record's jobs: the earliest due poll,
    job deadline or (in WAITING_TOOL) wait deadline; None when nothing is due ever."""
    times: list[float] = []
    for op in open_jobs(rec):
        job = op.job
        assert job is not None
        if job.handle is not None and job.next_poll_at is not None:
            times.append(job.next_poll_at)
        if rec.state in LIVE and job.status not in FINAL and not job.cancel_requested:
            times.append(job.deadline)
    if rec.state is S.WAITING_TOOL and rec.wait_deadline is not None:
        times.append(rec.wait_deadline)
    return min(times) if times else None


def waiting_for_input(rec: TrajectoryRecord) -> list[Operation]:
    """Open jobs that asked for input and have not had it."""
    return [
        op for op in open_jobs(rec) if op.job is not None and op.job.status is JobStatus.NEEDS_INPUT
    ]
