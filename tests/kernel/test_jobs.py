"""Asynchronous tool jobs in the kernel: register before start, reports settled exactly once,
polls on the kernel's schedule, input asked and given, cancel and kill reaching running jobs."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.errors import UnknownReference
from kernel.events import (
    CallModel,
    CancelCall,
    CancelJob,
    DispatchTool,
    Enqueue,
    GiveInput,
    PollJob,
    StartJob,
)
from kernel.job_specs import InputRequest, JobStatus
from kernel.record import ControlKind, OpStatus, TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from kernel.tool_job_polls import next_due
from tests.kernel.jobs_harness import LIABILITY, JobDriver, call, job_tool

S = LifecycleState
D = Decimal


def tool_dollars(d: JobDriver) -> tuple[Decimal, Decimal]:
    led = d.rec.ledger
    return led.dollars.actual, led.dollars.reserved


# --- item 1: start, reports, settlement, polls -----------------------------------------------


def test_a_job_is_registered_and_reserved_before_its_start_is_sent() -> None:
    d = JobDriver()
    (cmd,) = d.propose(call())
    assert d.rec.state is S.WAITING_TOOL
    assert d.commands(DispatchTool) == [], "a job is started, not dispatched"
    op = d.op(cmd)
    assert op.job is not None and op.job.status is JobStatus.STARTING and op.job.handle is None
    assert d.rec.ledger.reservations[cmd.attempt_id].dollars == LIABILITY
    assert cmd.epoch == op.epoch and cmd.idempotency_key == op.idempotency_key
    assert next_due(d.rec) == op.job.deadline, "no poll before the start names a handle"
    d.started(cmd, "h-42")
    job = d.op(cmd).job
    assert job is not None and job.handle == "h-42" and job.status is JobStatus.RUNNING
    assert job.next_poll_at == d.now + 5.0 and next_due(d.rec) == d.now + 5.0
    assert d.commands(CallModel) == [] and d.commands(Enqueue) == [], "no worker is held"


def test_a_report_settles_exactly_its_charge_and_releases_the_rest() -> None:
    d = JobDriver()
    cmd = d.start()
    actual0, reserved0 = tool_dollars(d)
    d.report(cmd, JobStatus.DONE, "0.20", {"passed": 12}, now=30.0)
    actual, reserved = tool_dollars(d)
    assert actual - actual0 == D("0.20") and reserved0 - reserved == LIABILITY
    assert d.op(cmd).status is OpStatus.SETTLED
    assert d.rec.last_observation is not None and d.rec.last_observation["passed"] == 12
    assert d.rec.state is S.READY and d.commands(Enqueue)


def test_a_duplicate_report_settles_once_and_changes_nothing() -> None:
    d = JobDriver()
    cmd = d.start()
    d.report(cmd, JobStatus.DONE, "0.20", {"passed": 12}, now=30.0)
    before = d.rec.to_json()
    again = d.report(cmd, JobStatus.DONE, "0.20", {"passed": 12}, now=31.0)
    assert again.record.to_json() == before and again.commands == [] and again.rows == []
    assert again.ack == {
        "outcome": "ignored",
        "reason": "after_done",
        "call_id": cmd.call_id,
        "attempt": cmd.attempt_id,
    }


def test_a_repeated_running_report_changes_nothing() -> None:
    d = JobDriver()
    cmd = d.start()
    d.report(cmd, JobStatus.RUNNING, "0.05", now=5.0)
    before = d.rec.to_json()
    again = d.report(cmd, JobStatus.RUNNING, "0.05", now=6.0)
    assert again.ack is not None and again.ack["reason"] == "duplicate"
    assert d.rec.to_json() == before


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"attempt": "t1/t1/a9"}, "wrong_attempt"),
        ({"epoch": 7}, "stale_epoch"),
    ],
)
def test_a_report_for_another_attempt_or_epoch_is_ignored(
    override: dict[str, object], reason: str
) -> None:
    d = JobDriver()
    cmd = d.start()
    before = d.rec.to_json()
    out = d.report(cmd, JobStatus.DONE, "0.20", **override)  # type: ignore[arg-type]
    assert out.ack is not None and out.ack["reason"] == reason
    assert d.rec.to_json() == before, "an ignored report changes nothing"


def test_an_older_numbered_report_is_ignored() -> None:
    d = JobDriver()
    cmd = d.start()
    d.report(cmd, JobStatus.RUNNING, "0.10", seq=3, now=5.0)
    before = d.rec.to_json()
    late = d.report(cmd, JobStatus.RUNNING, "0.15", seq=2, now=6.0)
    assert late.ack is not None and late.ack["reason"] == "stale_report"
    assert d.rec.to_json() == before


def test_running_reports_book_their_bill_and_the_final_one_the_rest() -> None:
    d = JobDriver()
    cmd = d.start()
    actual0, reserved0 = tool_dollars(d)
    d.report(cmd, JobStatus.RUNNING, "0.10", now=5.0)
    actual, reserved = tool_dollars(d)
    assert actual - actual0 == D("0.10") and reserved0 - reserved == D("0.10")
    d.report(cmd, JobStatus.DONE, "0.30", now=10.0)
    actual, reserved = tool_dollars(d)
    assert actual - actual0 == D("0.30") and reserved0 - reserved == LIABILITY


def test_a_final_report_without_a_bill_keeps_the_dollars_reserved_until_one_comes() -> None:
    d = JobDriver()
    cmd = d.start()
    actual0, reserved0 = tool_dollars(d)
    d.report(cmd, JobStatus.DONE, None, {"passed": 1}, now=10.0)
    assert tool_dollars(d) == (actual0, reserved0), "no evidence of dollars: nothing released"
    assert d.op(cmd).open and d.rec.state is S.READY, "the result is in; the bill is owed"
    d.report(cmd, JobStatus.DONE, "0.25", now=20.0)
    actual, reserved = tool_dollars(d)
    assert actual - actual0 == D("0.25") and reserved0 - reserved == LIABILITY
    assert d.op(cmd).status is OpStatus.SETTLED


def test_polls_are_recorded_before_they_are_sent_backed_off_and_bounded() -> None:
    d = JobDriver()
    cmd = d.start()
    started = d.now
    due: list[float] = []
    for _ in range(7):
        at = next_due(d.rec)
        assert at is not None
        early = d.tick(at - 0.5)
        assert (
            early.commands == []
            and early.record.record_version == d.history[-2].record.record_version
        )
        out = d.tick(at)
        (poll,) = d.commands(PollJob)
        assert poll.handle == "h1" and poll.epoch == cmd.epoch
        assert not any(isinstance(c, CallModel) for c in out.commands), "polling wakes no model"
        due.append(round(at - started, 6))
    assert due == [5.0, 15.0, 35.0, 75.0, 115.0, 155.0, 195.0]  # 5, 10, 20, 40, then 40 each
    job = d.op(cmd).job
    assert job is not None and job.polls == 7


def test_polling_stops_after_max_polls() -> None:
    d = JobDriver(job_tool(timeout_s=10_000))
    d.start()
    for _ in range(20):
        at = next_due(d.rec)
        assert at is not None and at < 10_000
        d.tick(at)
    (op,) = [o for o in d.rec.operations.values() if o.job is not None]
    assert op.job is not None and op.job.polls == 20 and op.job.next_poll_at is None
    assert next_due(d.rec) == op.job.deadline, "only the deadline is left to watch"


# --- item 1: the deadline and the wall clock keep running ------------------------------------


def test_a_job_past_its_deadline_is_cancelled_and_the_run_stops_deadline() -> None:
    d = JobDriver(job_tool(timeout_s=100))
    cmd = d.start()
    _, reserved0 = tool_dollars(d)
    d.tick(d.now + 100)
    (cancel,) = d.commands(CancelJob)
    assert cancel.handle == "h1" and cancel.call_id == cmd.call_id
    assert d.rec.stop_reason is StopReason.DEADLINE
    assert d.op(cmd).status is OpStatus.UNKNOWN
    assert cmd.attempt_id in d.rec.ledger.reservations, "a deadline never refunds"
    d.report(cmd, JobStatus.CANCELED, "0.40", now=d.now + 3)
    _actual, reserved = tool_dollars(d)
    assert d.op(cmd).status is OpStatus.SETTLED and reserved == reserved0 - LIABILITY


def test_the_wall_clock_stops_a_run_and_its_job() -> None:
    d = JobDriver(job_tool(timeout_s=10_000))
    cmd = d.start()
    d.tick(d.rec.budget.wall_clock_s + 1)
    assert d.rec.stop_reason is StopReason.WALL_CLOCK
    assert [c.call_id for c in d.commands(CancelJob)] == [cmd.call_id]
    assert cmd.attempt_id in d.rec.ledger.reservations


# --- item 2: input --------------------------------------------------------------------------


def test_a_job_asking_for_input_records_it_and_takes_an_answer_naming_it() -> None:
    d = JobDriver()
    cmd = d.start()
    ask = InputRequest(input_id="db-choice", prompt="Which database?", asks={"type": "string"})
    d.report(cmd, JobStatus.NEEDS_INPUT, ask=ask, now=5.0)
    job = d.op(cmd).job
    assert job is not None and job.status is JobStatus.NEEDS_INPUT and job.input_request == ask
    assert job.next_poll_at is None and d.rec.state is S.WAITING_TOOL
    assert (
        json.loads(d.rec.to_json())["operations"][cmd.call_id]["job"]["input_request"]["prompt"]
        == "Which database?"
    ), "the pending dependency is in the record"
    before = d.rec.to_json()
    with pytest.raises(UnknownReference, match="asks for input 'db-choice', not 'db'") as wrong:
        d.answer(cmd, "db", "postgres")
    assert wrong.value.code == "wrong_input" and d.rec.to_json() == before
    with pytest.raises(UnknownReference) as stranger:
        d.answer(cmd, "db-choice", "postgres", by="mallory")
    assert stranger.value.code == "not_a_reviewer" and d.rec.to_json() == before
    d.answer(cmd, "db-choice", "postgres")
    (give,) = d.commands(GiveInput)
    assert (give.handle, give.input_id, give.answer) == ("h1", "db-choice", "postgres")
    job = d.op(cmd).job
    assert job is not None and job.status is JobStatus.RUNNING and job.answered == ["db-choice"]
    assert job.input_request is None and job.next_poll_at is not None
    repeat = d.answer(cmd, "db-choice", "postgres")
    assert repeat.ack is not None and repeat.ack["reason"] == "duplicate" and repeat.commands == []
    old = d.report(cmd, JobStatus.NEEDS_INPUT, ask=ask, now=7.0)
    assert old.ack is not None and old.ack["reason"] == "duplicate", "an answered request again"
    d.report(cmd, JobStatus.DONE, "0.10", {"ok": True}, now=9.0)
    assert d.op(cmd).status is OpStatus.SETTLED and d.rec.state is S.READY


def test_an_answer_to_a_job_that_asks_nothing_is_refused() -> None:
    d = JobDriver()
    cmd = d.start()
    before = d.rec.to_json()
    with pytest.raises(UnknownReference) as refused:
        d.answer(cmd, "x", 1)
    assert refused.value.code == "no_input_request" and d.rec.to_json() == before


# --- item 3: cancel, kill, pause -------------------------------------------------------------


def test_kill_cancels_the_job_at_once_and_holds_its_reservation_until_the_report() -> None:
    d = JobDriver()
    cmd = d.start()
    actual0, reserved0 = tool_dollars(d)
    out = d.control(ControlKind.KILL)
    (cancel,) = d.commands(CancelJob)
    assert cancel.handle == "h1" and not d.commands(CancelCall), "a job is cancelled as a job"
    assert d.rec.state is S.CANCELED and d.rec.stop_reason is StopReason.KILLED
    assert d.op(cmd).status is OpStatus.UNKNOWN
    assert tool_dollars(d) == (actual0, reserved0), "nothing settled without evidence"
    assert out.ack is not None and out.ack["outstanding"] == [cmd.call_id]
    d.tick(d.now + 5)  # the ended run's job is still polled for its report
    assert [p.call_id for p in d.commands(PollJob)] == [cmd.call_id]
    d.report(cmd, JobStatus.CANCELED, "0.15", now=d.now + 1)
    actual, reserved = tool_dollars(d)
    assert actual - actual0 == D("0.15") and reserved0 - reserved == LIABILITY
    assert d.op(cmd).status is OpStatus.SETTLED
    assert d.rec.last_observation is None or d.rec.last_observation.get("code") != "job_canceled"


def test_kill_before_the_start_is_answered_cancels_by_key() -> None:
    d = JobDriver()
    (cmd,) = d.propose(call())
    d.control(ControlKind.KILL)
    (cancel,) = d.commands(CancelJob)
    assert cancel.handle is None and cancel.idempotency_key == cmd.idempotency_key


def test_pause_lets_a_finish_policy_job_run_and_its_report_settles_unseen() -> None:
    d = JobDriver()
    cmd = d.start("run_tests")
    actual0, _ = tool_dollars(d)
    d.control(ControlKind.PAUSE)
    assert d.rec.state is S.PAUSED and d.commands(CancelJob) == []
    assert d.op(cmd).open, "the job runs on under its reservation"
    d.report(cmd, JobStatus.DONE, "0.20", {"passed": 3}, now=20.0)
    assert d.op(cmd).status is OpStatus.SETTLED and tool_dollars(d)[0] - actual0 == D("0.20")
    assert d.rec.state is S.PAUSED, "a report never resumes a paused run"
    assert d.rec.last_observation is None or "passed" not in d.rec.last_observation


def test_pause_cancels_a_cancel_policy_job_and_waits_for_its_report() -> None:
    d = JobDriver()
    cmd = d.start("run_lint")
    d.control(ControlKind.PAUSE)
    (cancel,) = d.commands(CancelJob)
    assert cancel.call_id == cmd.call_id and d.rec.state is S.PAUSED
    assert d.op(cmd).status is OpStatus.REGISTERED, "the outcome is the one the backend confirms"
    assert cmd.attempt_id in d.rec.ledger.reservations


def test_cancel_stops_a_job_the_pause_let_run() -> None:
    d = JobDriver()
    cmd = d.start("run_tests")
    d.control(ControlKind.PAUSE)
    d.control(ControlKind.CANCEL, rid="c2")
    assert [c.call_id for c in d.commands(CancelJob)] == [cmd.call_id]
    assert d.rec.stop_reason is StopReason.CANCELED
    assert cmd.attempt_id in d.rec.ledger.reservations


def test_recovery_polls_a_started_job_instead_of_starting_it_again() -> None:
    from kernel.events import Recover

    d = JobDriver()
    d.start()
    d.apply(Recover(now=d.now + 1))
    assert d.commands(StartJob) == [] and d.commands(DispatchTool) == []
    assert next_due(d.rec) == d.now + 1
    fresh = JobDriver()
    (unanswered,) = fresh.propose(call())
    fresh.apply(Recover(now=fresh.now + 1))
    (again,) = fresh.commands(StartJob)
    assert (again.attempt_id, again.idempotency_key) == (
        unanswered.attempt_id,
        unanswered.idempotency_key,
    ), "the same key: the backend starts one job"


# --- the record's schema -------------------------------------------------------------------


def test_a_version_7_record_reads_with_no_jobs() -> None:
    d = JobDriver()
    d.reply(d.admit(), {"type": "tool", "name": "run_tests", "args": {"suite": "x"}})
    raw = json.loads(d.rec.to_json())
    raw["schema_version"] = 7
    for op in raw["operations"].values():
        del op["job"]
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == 8 and all(op.job is None for op in back.operations.values())


# --- property: any order and duplication of reports settles exactly once ------------------


CENTS = st.integers(min_value=0, max_value=50)


@settings(max_examples=200, deadline=None)
@given(
    bills=st.lists(CENTS, min_size=1, max_size=4).map(sorted),
    final=st.sampled_from([JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELED]),
    order=st.lists(st.integers(min_value=0, max_value=20), min_size=1, max_size=12),
    strays=st.lists(st.sampled_from(["attempt", "epoch"]), max_size=3),
)
def test_any_order_and_duplication_of_reports_settles_once_within_the_reservation(
    bills: list[int], final: JobStatus, order: list[int], strays: list[str]
) -> None:
    d = JobDriver()
    cmd = d.start()
    actual0, reserved0 = tool_dollars(d)
    ceiling = actual0 + reserved0
    # The job's true history: running reports with growing bills, then a final one.
    history = [(JobStatus.RUNNING, bill) for bill in bills[:-1]] + [(final, bills[-1])]
    deliveries = [history[i % len(history)] for i in order] + [history[-1]]
    for n, stray in enumerate(strays):
        d.report(
            cmd,
            final,
            "0.49",
            attempt="t1/t1/a9" if stray == "attempt" else None,
            epoch=99 if stray == "epoch" else None,
            now=d.now + 0.1 * n,
        )
    for status, cents in deliveries:
        d.report(cmd, status, str(D(cents) / 100), now=d.now + 1)
        actual, reserved = tool_dollars(d)
        assert actual + reserved <= ceiling, "a job never costs more than its reservation"
    actual, reserved = tool_dollars(d)
    assert d.op(cmd).status is OpStatus.SETTLED
    assert reserved == reserved0 - LIABILITY, "the reservation is released once"
    # Settled exactly once, at the final bill (bills are cumulative: no report adds to it).
    assert actual - actual0 == D(bills[-1]) / 100
