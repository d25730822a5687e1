"""The embedded runner's side of asynchronous tool jobs (``kernel.tool_jobs``).

A job's start returns a handle at once; nothing waits on the job. When the runner has nothing
else to do and a job of the run is still owed, it moves its clock to the kernel's next due time
(:func:`kernel.tool_job_polls.next_due`) and delivers a Tick: the kernel records the polls that
are due and asks for them, and the runner delivers every report a poll returns, in the order
the backend gave them (a repeat is the kernel's to ignore). A job that asked for input
suspends the run until :meth:`EmbeddedRunner.give_input` answers it.
"""

from __future__ import annotations

from collections.abc import Callable

from kernel.events import (
    CancelJob,
    Event,
    GiveInput,
    JobReported,
    JobStarted,
    PollJob,
    StartJob,
    Tick,
)
from kernel.fastmodel import construct
from kernel.job_specs import JobBackend
from kernel.record import TrajectoryRecord
from kernel.states import LIVE, LifecycleState
from kernel.tool_job_polls import next_due, open_jobs, waiting_for_input

JobCommand = StartJob | PollJob | CancelJob | GiveInput


class NoJobBackend(TypeError):
    """A job tool was started by a runner given no backend that runs jobs."""


def carry_out(
    jobs: JobBackend | None,
    rec: TrajectoryRecord,
    cmd: JobCommand,
    now: Callable[[], float],
    advance: Callable[[float], None],
) -> list[Event]:
    """Do what one job command asks; return the events it produced (none, one, or a poll's
    reports). ``now`` and ``advance`` are the runner's clock."""
    if jobs is None:
        raise NoJobBackend(f"{cmd.type} for {cmd.call_id}: this runner has no job backend")
    if isinstance(cmd, StartJob):
        handle, secs = jobs.start(
            rec.user, cmd.tool, cmd.args, cmd.idempotency_key, cmd.timeout_s, fence=cmd.fence
        )
        advance(secs)
        return [
            JobStarted(
                now=now(),
                call_id=cmd.call_id,
                attempt_id=cmd.attempt_id,
                handle=handle,
                latency_s=secs,
            )
        ]
    if isinstance(cmd, PollJob):
        updates, secs = jobs.poll(cmd.handle)
        advance(secs)
        return [
            JobReported(
                now=now(),
                call_id=cmd.call_id,
                attempt_id=cmd.attempt_id,
                epoch=cmd.epoch,
                status=u.status,
                result=u.result,
                charge=u.charge,
                input_request=u.input_request,
                seq=u.seq,
                latency_s=secs if i == 0 else 0.0,
            )
            for i, u in enumerate(updates)
        ]
    if isinstance(cmd, CancelJob):
        if cmd.handle is not None:  # the start and its answer are one step here
            advance(jobs.cancel(cmd.handle))
        return []
    advance(jobs.give_input(cmd.handle, cmd.input_id, cmd.answer))
    return []


def wake(rec: TrajectoryRecord, now: float) -> float | None:
    """When the runner should next step ``rec`` for its jobs (None: not now). A run whose job
    waits for input, or that is paused or held, is left suspended; otherwise the kernel's
    next due time, once a job is still owed."""
    if not open_jobs(rec):
        return None
    waiting = rec.state is LifecycleState.WAITING_TOOL and not waiting_for_input(rec)
    if rec.state in LIVE and not waiting:
        return None
    due = next_due(rec)
    return None if due is None else max(due, now)


def tick_at(at: float) -> Tick:
    """A Tick at ``at`` (the runner's own clock: no re-validation)."""
    return construct(Tick, now=at)
