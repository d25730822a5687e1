"""The embedded runner: drives the step function in-process against a model and a backend.

It is the laptop default and the harness of the kernel's tests: a simulated clock advances by
the latencies the model and the tools report, so runs are deterministic and fast. A run stops
when the trajectory ends, or when it is suspended (held for approval, paused): ``resume`` then
carries on from the record, exactly as a fleet worker would from the store. A run that ends
owing (a write whose outcome is unknown) is reconciled here before ``run`` returns.

The runner carries a plan's fan-out out one call after another, so a call may start later than
the kernel decided it: each starts with its timeout cut to the time the clocks have left then,
and one whose run has ended or whose clocks ran out meanwhile is not sent (its result says so).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.chain import ChainRow
from kernel.context import KernelContext, StepResult
from kernel.events import (
    Admit,
    ApprovalDecided,
    CallModel,
    CancelCall,
    CancelJob,
    Command,
    DispatchTool,
    Enqueue,
    Event,
    Finish,
    GiveInput,
    HoldForApproval,
    InputGiven,
    LookupEffect,
    PollJob,
    Reconcile,
    StartJob,
    ToolResulted,
)
from kernel.fastmodel import construct
from kernel.job_specs import JobBackend
from kernel.lifecycle import time_left
from kernel.owed import MAX_LOOKUPS
from kernel.record import HeldProposal, Operation, TrajectoryRecord
from kernel.states import LIVE
from kernel.step import step
from kernel.tool_job_polls import waiting_for_input
from kernel.tools import ToolBackend
from worker import embedded_jobs
from worker.backend import dispatch
from worker.models import Model


class Clock:
    """Simulated time, so runs are deterministic and fast."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def advance(self, seconds: float) -> None:
        """Move time forward; never backwards."""
        self.t = round(self.t + max(seconds, 0.0), 6)

    def now(self) -> float:
        """The current reading."""
        return self.t


Commit = Callable[[TrajectoryRecord, TrajectoryRecord, list[ChainRow]], None]
"""A store hook: (previous record, new record, chain rows) -> None, raising on conflict."""


@dataclass
class RunResult:
    """A run's final record, what it held for, and the chain it wrote."""

    record: TrajectoryRecord
    rows: list[ChainRow] = field(default_factory=list)
    held: HoldForApproval | None = None
    events: list[Event] = field(default_factory=list)
    input: Operation | None = None  # a job waiting for input: answer with ``give_input``
    ignored: list[dict[str, Any]] = field(default_factory=list)  # reports that changed nothing


class EmbeddedRunner:
    """Carries out kernel commands in-process, one at a time."""

    def __init__(
        self,
        ctx: KernelContext,
        model: Model,
        backend: ToolBackend,
        clock: Clock | None = None,
        commit: Commit | None = None,
        max_events: int = 10_000,
        bind: Callable[[TrajectoryRecord], ToolBackend] | None = None,
        jobs: JobBackend | None = None,
    ) -> None:
        self.ctx, self.model, self.backend = ctx, model, backend
        self.bind = bind  # the backend for one run's calls (the memory tools judge by the run)
        self.clock = clock or Clock()
        self.commit = commit
        self.max_events = max_events
        self.last: TrajectoryRecord | None = None  # the newest record, even if a run raised
        # The backend of job tools: ``jobs``, else the tool backend if it runs jobs too.
        self.jobs = (
            jobs if jobs is not None else backend if isinstance(backend, JobBackend) else None
        )
        self._inbox: deque[Event] = deque()  # events a command produced, not yet stepped

    def apply(self, rec: TrajectoryRecord, event: Event, out: RunResult) -> StepResult:
        """One step, committed through the store hook when it changed anything."""
        result = step(rec, event, self.ctx)
        out.events.append(event)
        if result.ack is not None and result.ack.get("outcome") == "ignored":
            out.ignored.append(result.ack)  # kept for audit: it changed nothing
        if result.record is not rec and self.commit is not None:
            self.commit(rec, result.record, result.rows)
        out.rows.extend(result.rows)
        self.last = result.record
        return result

    def run(
        self, rec: TrajectoryRecord, first: Event | None = None, until: float | None = None
    ) -> RunResult:
        """Advance until the trajectory ends or is suspended; with ``until``, also hand back
        a run waiting on a job once its next due time would pass that reading."""
        out = RunResult(record=rec)
        todo: deque[Command] = deque()
        result = self.apply(rec, first or self.admission(), out)
        rec = result.record
        todo.extend(result.commands)
        while True:
            while todo or self._inbox:
                if len(out.events) > self.max_events:  # pragma: no cover - budgets end runs
                    raise RuntimeError("embedded run did not end within its event bound")
                if self._inbox:  # a poll's further reports, in the backend's order
                    event: Event | None = self._inbox.popleft()
                else:
                    event = self.carry_out(rec, todo.popleft(), out)
                if event is None:
                    continue
                result = self.apply(rec, event, out)
                rec = result.record
                todo.extend(result.commands)
            due = embedded_jobs.wake(rec, self.clock.now()) if out.held is None else None
            if due is None or (until is not None and due > until):
                break  # nothing owed by a job, the run is suspended, or handed back
            self.clock.advance(due - self.clock.now())  # no thread waits: the clock moves
            result = self.apply(rec, embedded_jobs.tick_at(self.clock.now()), out)
            rec = result.record
            todo.extend(result.commands)
        out.record = self._settle_owed(rec, out)
        out.input = next(iter(waiting_for_input(rec)), None) if rec.state in LIVE else None
        return out

    def _settle_owed(self, rec: TrajectoryRecord, out: RunResult) -> TrajectoryRecord:
        """An ended run that still owes: the runner is its reconciler (``kernel.owed``). Calls
        here are synchronous, so each pass's lookups are answered at once; a pass is repeated
        only for an answer that could not tell, and the kernel's own bound ends that."""
        for _ in range(MAX_LOOKUPS + 1):
            if rec.state in LIVE or not rec.open_operations:
                break
            result = self.apply(rec, construct(Reconcile, now=self.clock.now()), out)
            rec = result.record
            for cmd in result.commands:
                event = self.carry_out(rec, cmd, out)
                if event is not None:
                    rec = self.apply(rec, event, out).record
        return rec

    def carry_out(self, rec: TrajectoryRecord, cmd: Command, out: RunResult) -> Event | None:
        """Do what one command asks and report back with the event it produced."""
        if isinstance(cmd, CallModel):
            reply = self.model.call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
            self.clock.advance(reply.latency_s)
            return reply.replied(cmd.call_id, self.clock.now())
        if isinstance(cmd, DispatchTool):
            left = time_left(rec, self.clock.now())
            if rec.state not in LIVE or left <= 0:
                return self._not_sent(cmd)
            cmd = cmd.model_copy(update={"timeout_s": min(cmd.timeout_s, left)})
        if isinstance(cmd, DispatchTool | LookupEffect):
            looked_up = isinstance(cmd, LookupEffect)
            backend = self.backend if self.bind is None else self.bind(rec)
            result, secs = dispatch(backend, rec.user, cmd)
            self.clock.advance(secs)
            return ToolResulted(
                now=self.clock.now(),
                call_id=cmd.call_id,
                attempt_id=cmd.attempt_id,
                result=result,
                latency_s=secs,
                looked_up=looked_up,
            )
        if isinstance(cmd, StartJob | PollJob | CancelJob | GiveInput):
            jobs = self.jobs
            events = embedded_jobs.carry_out(jobs, rec, cmd, self.clock.now, self.clock.advance)
            self._inbox.extend(events)
            return None
        if isinstance(cmd, Enqueue):
            return self.admission()
        if isinstance(cmd, HoldForApproval):
            out.held = cmd
            return None
        if isinstance(cmd, Finish | CancelCall):
            return None  # calls here are synchronous: nothing is left running to cancel
        raise TypeError(f"unknown command {cmd!r}")  # pragma: no cover

    def _not_sent(self, cmd: DispatchTool) -> ToolResulted:
        """The result of a call that was never sent: its run ended, or a clock ran out, while
        the calls before it in the fan-out ran."""
        result = {
            "status": "error",
            "code": "not_sent",
            "dispatch_status": "not_sent",
            "detail": "the run ended or a clock ran out before this call could start",
        }
        now = self.clock.now()
        return ToolResulted(
            now=now, call_id=cmd.call_id, attempt_id=cmd.attempt_id, result=result, latency_s=0.0
        )

    def admission(self) -> Admit:
        """An admission request at the current reading (built from the runner's own clock,
        so without re-validation)."""
        return construct(Admit, now=self.clock.now())

    def give_input(
        self, rec: TrajectoryRecord, call_id: str, input_id: str, answer: Any, by: str = "reviewer"
    ) -> RunResult:
        """Answer the input request of job ``call_id`` (it must name ``input_id``) and run on."""
        given = InputGiven(
            now=self.clock.now(), call_id=call_id, input_id=input_id, answer=answer, given_by=by
        )
        return self.run(rec, given)

    def approve(
        self,
        rec: TrajectoryRecord,
        held: HoldForApproval | HeldProposal,
        reviewer: str = "reviewer",
        approve: bool = True,
    ) -> RunResult:
        """Deliver a reviewer's decision on a held proposal and run on."""
        return self.run(rec, decision_on(held, self.clock.now(), reviewer, approve))


def decision_on(
    held: HoldForApproval | HeldProposal,
    now: float,
    reviewer: str,
    approve: bool,
    comment: str = "",
) -> ApprovalDecided:
    """A reviewer's decision naming exactly the held request: its id, version and digest."""
    return ApprovalDecided(
        now=now,
        approval_id=held.approval_id,
        held_version=held.held_version,
        digest=held.digest,
        reviewer=reviewer,
        approve=approve,
        comment=comment,
    )
