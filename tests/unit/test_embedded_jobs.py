"""The embedded runner with an in-memory job backend that misbehaves: it reports twice,
reports late, and asks for input. The runner starts jobs without waiting on them, polls on
the kernel's schedule only, and delivers every report; the kernel settles each job once."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.events import ControlRequested, JobReported, JobStarted, PollJob, Tick
from kernel.job_specs import InputRequest, JobStatus, JobUpdate
from kernel.record import ControlKind, OpStatus, TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from tests.kernel.harness import new_record
from tests.kernel.jobs_harness import LIABILITY, job_profile, job_tool
from worker.embedded import Clock, EmbeddedRunner
from worker.models import ScriptedModel

S = LifecycleState
BUDGET = Budget(max_steps=10, max_tool_calls=10, max_tokens=100_000, deadline_s=1000, max_cost=5)


@dataclass
class Job:
    started: float
    key: str
    answers: dict[str, Any] = field(default_factory=dict)
    cancelled_at: float | None = None


@dataclass
class FakeJobs:
    """Jobs that take ``duration`` s and bill ``charge``; optionally misbehaving."""

    clock: Clock
    duration: float = 30.0
    charge: Decimal = Decimal("0.20")
    twice: bool = False  # every final report comes twice
    ask_at: float | None = None  # seconds in, the job asks for input "i1"
    stale_after_done: bool = False  # after its final report, an old running one follows
    cancel_takes: float = 3.0
    jobs: dict[str, Job] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def start(
        self, user: str, tool: str, args: dict[str, Any], key: str, timeout_s: float, *, fence: int
    ) -> tuple[str, float]:
        self.calls.append("start")
        for handle, job in self.jobs.items():
            if job.key == key:
                return handle, 0.1  # one job per key
        handle = f"h{len(self.jobs) + 1}"
        self.jobs[handle] = Job(started=self.clock.now(), key=key)
        return handle, 0.1

    def poll(self, handle: str) -> tuple[list[JobUpdate], float]:
        self.calls.append("poll")
        job, now = self.jobs[handle], self.clock.now()
        ran = now - job.started
        if job.cancelled_at is not None and now >= job.cancelled_at + self.cancel_takes:
            part = (self.charge * Decimal(str(min(ran / self.duration, 1)))).quantize(
                Decimal("0.01")
            )
            return [JobUpdate(JobStatus.CANCELED, {"code": "canceled"}, part)], 0.05
        if self.ask_at is not None and ran >= self.ask_at and "i1" not in job.answers:
            ask = InputRequest(input_id="i1", prompt="Which database?")
            return [JobUpdate(JobStatus.NEEDS_INPUT, input_request=ask)], 0.05
        if ran < self.duration or job.cancelled_at is not None:
            return [JobUpdate(JobStatus.RUNNING)], 0.05
        done = JobUpdate(JobStatus.DONE, {"passed": 12, **job.answers}, self.charge)
        updates = [done, done] if self.twice else [done]
        if self.stale_after_done:
            updates.append(JobUpdate(JobStatus.RUNNING, charge=Decimal("0.01")))
        return updates, 0.05

    def cancel(self, handle: str) -> float:
        self.calls.append("cancel")
        self.jobs[handle].cancelled_at = self.clock.now()
        return 0.01

    def give_input(self, handle: str, input_id: str, answer: Any) -> float:
        self.calls.append("give_input")
        self.jobs[handle].answers[input_id] = answer
        return 0.01


class NoTools:
    def call(self, *a: Any, **k: Any) -> tuple[dict[str, Any], float]:  # pragma: no cover
        raise AssertionError("a job tool is never called synchronously")

    def lookup(self, *a: Any, **k: Any) -> tuple[dict[str, Any], float]:  # pragma: no cover
        raise AssertionError("no lookups here")


def repair_policy(view: dict[str, Any], n: int) -> Any:
    if n == 1:
        return {"type": "tool", "name": "run_tests", "args": {"suite": "unit"}}
    return {"type": "final", "outcome": "completed"}


def runner(jobs: FakeJobs, clock: Clock, timeout_s: float = 600) -> EmbeddedRunner:
    ctx = KernelContext(job_profile(job_tool(timeout_s=timeout_s), budget=BUDGET))
    return EmbeddedRunner(ctx, ScriptedModel(repair_policy), NoTools(), clock=clock, jobs=jobs)


def job_op(rec: TrajectoryRecord) -> Any:
    (op,) = [op for op in rec.operations.values() if op.job is not None]
    return op


def polls_in(events: list[Any]) -> list[float]:
    return [e.now for e in events if isinstance(e, Tick)]


def test_a_job_runs_to_done_polled_on_the_kernels_schedule_only() -> None:
    clock = Clock()
    jobs = FakeJobs(clock)
    r = runner(jobs, clock)
    out = r.run(new_record(BUDGET))
    rec = out.record
    assert rec.stop_reason is StopReason.DONE, rec.closing_message
    op = job_op(rec)
    assert op.status is OpStatus.SETTLED and op.evidence["passed"] == 12
    assert rec.ledger.dollars.reserved == 0
    assert jobs.calls.count("start") == 1
    # ticks at the start's answer + 5, 15, 35: the job finished by then (30 s)
    (started,) = [e.now for e in out.events if isinstance(e, JobStarted)]
    assert [round(t - started, 3) for t in polls_in(out.events)] == [5.0, 15.0, 35.0]
    assert jobs.calls.count("poll") == 3


def test_a_job_reporting_twice_is_settled_once_and_the_repeat_kept_for_audit() -> None:
    clock = Clock()
    jobs = FakeJobs(clock, twice=True, stale_after_done=True)
    out = runner(jobs, clock).run(new_record(BUDGET))
    rec = out.record
    assert rec.stop_reason is StopReason.DONE
    reports = [e for e in out.events if isinstance(e, JobReported)]
    assert [e.status for e in reports[-3:]] == [JobStatus.DONE, JobStatus.DONE, JobStatus.RUNNING]
    late = [a["reason"] for a in out.ignored if a["reason"] != "duplicate"]  # not: "running"
    assert late == ["after_done", "after_done"]
    model_dollars = rec.ledger.dollars.actual - Decimal("0.20")
    assert model_dollars > 0 and rec.ledger.dollars.reserved == 0
    tool_rows = [r for r in out.rows if r.kind == "tool" and r.outcome == "done"]
    assert len(tool_rows) == 1, "one settlement row"


def test_a_late_report_after_a_kill_settles_the_held_reservation() -> None:
    clock = Clock()
    jobs = FakeJobs(clock, duration=300.0)
    seen: list[TrajectoryRecord] = []
    r = runner(jobs, clock)
    r.commit = lambda prev, new, rows: seen.append(new)
    waiting = r.run(new_record(BUDGET), until=20.0)
    assert waiting.record.state is S.WAITING_TOOL, "handed back while its job runs"
    assert clock.now() <= 20.0
    kill = ControlRequested(
        now=clock.now(), kind=ControlKind.KILL, request_id="k1", requested_by="operator"
    )
    out = r.run(waiting.record, kill)
    assert jobs.calls.count("cancel") == 1
    killed = next(rec for rec in seen if rec.state is S.CANCELED)
    op = job_op(killed)
    assert op.status is OpStatus.UNKNOWN and op.attempts[-1] in killed.ledger.reservations
    rec = out.record
    assert rec.stop_reason is StopReason.KILLED
    op = job_op(rec)
    assert op.status is OpStatus.SETTLED and op.evidence["code"] == "canceled"
    assert rec.ledger.dollars.reserved == 0
    tool_part = rec.ledger.dollars.actual - killed.ledger.dollars.actual
    assert Decimal(0) < tool_part < LIABILITY, "its partial bill, not the reservation"
    assert "written_off" not in [row.outcome for row in out.rows], "the report settled it"


def test_a_job_asking_for_input_suspends_the_run_until_it_is_answered() -> None:
    import pytest

    from kernel.errors import UnknownReference

    clock = Clock()
    jobs = FakeJobs(clock, ask_at=8.0)
    r = runner(jobs, clock)
    out = r.run(new_record(BUDGET))
    assert out.record.state is S.WAITING_TOOL and out.input is not None
    assert out.input.job.input_request.prompt == "Which database?"
    polls = jobs.calls.count("poll")
    with pytest.raises(UnknownReference, match="asks for input 'i1', not 'i2'"):
        r.give_input(out.record, out.input.call_id, "i2", "postgres")
    assert jobs.calls.count("give_input") == 0
    done = r.give_input(out.record, out.input.call_id, "i1", "postgres")
    assert jobs.calls.count("give_input") == 1 and jobs.calls.count("poll") > polls
    rec = done.record
    assert rec.stop_reason is StopReason.DONE
    assert job_op(rec).evidence["i1"] == "postgres"


def test_a_job_past_its_deadline_is_cancelled_and_settled_from_its_report() -> None:
    clock = Clock()
    jobs = FakeJobs(clock, duration=1000.0)
    out = runner(jobs, clock, timeout_s=100).run(new_record(BUDGET))
    rec = out.record
    assert rec.stop_reason is StopReason.DEADLINE
    assert jobs.calls.count("cancel") == 1
    op = job_op(rec)
    assert op.status is OpStatus.SETTLED and rec.ledger.dollars.reserved == 0
    assert any(isinstance(e, JobReported) and e.status is JobStatus.CANCELED for e in out.events)


def test_polls_never_outnumber_the_kernels_schedule() -> None:
    clock = Clock()
    jobs = FakeJobs(clock, duration=500.0)
    out = runner(jobs, clock, timeout_s=10_000).run(new_record(BUDGET))
    assert out.record.stop_reason is StopReason.DONE
    # at 5, 15, 35, 75, then every 40 s to 515: the polls a 500 s job needs, and no more
    assert jobs.calls.count("poll") == 15
    assert [e for e in out.events if isinstance(e, PollJob)] == [], "commands are not events"
