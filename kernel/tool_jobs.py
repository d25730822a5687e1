"""Asynchronous tool jobs: the start's answer, the job's reports, the input it asks for.

A report is correlated by operation and attempt, and by the control epoch its start was
registered under. One the record already heard (a duplicate, an older report number, a
report after the job's bill was settled) or one for another attempt or epoch changes nothing:
the step answers ``ack = {"outcome": "ignored", "reason": ...}`` for audit. An accepted
report settles exactly the charge it reports (cumulative: a running report books its part,
the final one books the rest and releases what the reservation held beyond it); a final
report without a bill counts the call and keeps the dollars reserved until one comes. The
first final report is the job's result: staged for the model only while its call is still
eligible under the current epoch (:func:`kernel.results.carry_on`). See
docs/adr/0220-async-jobs.md.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from kernel import tool_job_polls
from kernel.amounts import Amounts
from kernel.chain import RowKind
from kernel.context import Draft
from kernel.errors import UnknownReference
from kernel.events import GiveInput, InputGiven, JobReported, JobStarted
from kernel.job_specs import FINAL, JobStatus
from kernel.record import Operation, OpStatus
from kernel.results import carry_on
from kernel.states import LIVE

ZERO = Decimal(0)


def ignore(draft: Draft, op: Operation, attempt: str, reason: str) -> None:
    """Change nothing; say why, for audit."""
    draft.note = f"report for {op.call_id} ignored: {reason}"
    draft.ack = {"outcome": "ignored", "reason": reason, "call_id": op.call_id, "attempt": attempt}


def _job_op(draft: Draft, call_id: str) -> Operation:
    op = draft.rec.operations.get(call_id)
    if op is None or op.job is None:
        raise UnknownReference(
            f"trajectory {draft.rec.trajectory_id}: no job {call_id}", field="call_id"
        )
    return op


def on_started(draft: Draft, ev: JobStarted) -> None:
    """The backend took the job: its handle is recorded and its first poll scheduled."""
    op = _job_op(draft, ev.call_id)
    job = op.job
    assert job is not None
    if ev.attempt_id != op.attempts[-1]:
        ignore(draft, op, ev.attempt_id, "wrong_attempt")
        return
    if job.handle is not None:
        ignore(draft, op, ev.attempt_id, "duplicate" if job.handle == ev.handle else "other_handle")
        return
    draft.spend_time(ev.latency_s)
    running = job.status is JobStatus.STARTING
    update = tool_job_polls.update(
        op, handle=ev.handle, status=JobStatus.RUNNING if running else job.status
    )
    if op.open:  # a report may have come first: poll only for what is still owed
        tool_job_polls.update(op, next_poll_at=tool_job_polls.schedule(draft, op, update.polls))
    draft.row(
        RowKind.TOOL,
        call_id=op.call_id,
        tool=op.tool,
        args=op.args,
        outcome="started",
        duration_s=ev.latency_s,
        detail={"key": op.idempotency_key, "attempt": ev.attempt_id, "handle": ev.handle},
    )


def on_report(draft: Draft, ev: JobReported) -> None:
    """Fold one report (module docstring): ignore what was heard, settle what is billed,
    record a request for input, stage the first final result if it is still eligible."""
    op = _job_op(draft, ev.call_id)
    job = op.job
    assert job is not None
    why = _why_ignored(op, ev)
    if why is not None:
        ignore(draft, op, ev.attempt_id, why)
        return
    draft.spend_time(ev.latency_s)
    was_final = job.status in FINAL
    charged = ev.charge if ev.charge is not None else job.charged
    status = job.status if was_final else ev.status
    changes: dict[str, Any] = {"status": status, "charged": charged}
    if ev.seq is not None:
        changes["seq"] = ev.seq
    if not was_final:
        changes["input_request"] = ev.input_request if status is JobStatus.NEEDS_INPUT else None
        if status is JobStatus.NEEDS_INPUT:
            changes["next_poll_at"] = None  # nothing to ask until it is answered
        elif job.next_poll_at is None and job.handle is not None:
            changes["next_poll_at"] = tool_job_polls.schedule(draft, op, job.polls)
    tool_job_polls.update(op, **changes)
    _book(draft, op, ev, charged - job.charged, final=status in FINAL)
    outcome = ev.status.value if not was_final else "billed"
    detail: dict[str, Any] = {"key": op.idempotency_key, "attempt": ev.attempt_id}
    if ev.charge is not None:
        detail["charged_dollars"] = str(charged)
    if ev.input_request is not None and status is JobStatus.NEEDS_INPUT:
        detail["input_id"] = ev.input_request.input_id
        detail["prompt"] = ev.input_request.prompt
    draft.row(
        RowKind.TOOL,
        call_id=op.call_id,
        tool=op.tool,
        args=op.args,
        outcome=outcome,
        error=ev.result.get("code") if status in (JobStatus.FAILED, JobStatus.CANCELED) else None,
        duration_s=ev.latency_s,
        detail=detail,
    )
    if status in FINAL and not was_final:
        result = _for_model(ev)
        op.evidence = {"attempt": ev.attempt_id, **result}
        spec = draft.ctx.agent.catalog.get(op.tool or "")
        carry_on(draft, op, spec, result)


def _why_ignored(op: Operation, ev: JobReported) -> str | None:
    """The reason ``ev`` changes nothing, or None when it is news."""
    job = op.job
    assert job is not None
    if ev.attempt_id != op.attempts[-1]:
        return "wrong_attempt"
    if ev.epoch != op.epoch:
        return "stale_epoch"
    if not op.open:
        return "after_done"
    if ev.seq is not None and ev.seq <= job.seq:
        return "stale_report"
    if ev.charge is not None and ev.charge < job.charged:
        return "stale_report"  # a bill is cumulative: a smaller one is older
    if ev.status is JobStatus.NEEDS_INPUT and ev.input_request is None:
        return "no_input_request"
    billed = ev.charge is not None and ev.charge != job.charged
    if job.status in FINAL:
        return None if billed else "after_done"  # only its bill may still be news
    same_input = ev.input_request == job.input_request
    if ev.status is job.status and same_input and not billed:
        return "duplicate"
    if ev.input_request is not None and ev.input_request.input_id in job.answered:
        return "duplicate"  # a request already answered, reported again
    return None


def _book(draft: Draft, op: Operation, ev: JobReported, dollars: Decimal, final: bool) -> None:
    """Settle exactly what the report bills. Final with a bill (or nothing reserved in
    dollars): the reservation is released beyond it. Final without one: the call counts, the
    dollars stay reserved. Not final: the bill so far is booked, the rest stays reserved."""
    led = draft.rec.ledger
    attempt = op.attempts[-1]
    held = led.reservations.get(attempt)
    if held is None:
        return
    if final and (ev.charge is not None or held.dollars == 0):
        led.book(attempt, Amounts.of(tool_calls=held.tool_calls, dollars=dollars))
    elif final:
        led.book(attempt, Amounts.of(tool_calls=held.tool_calls), final=False)
    elif dollars > 0:
        led.book(attempt, Amounts.of(dollars=dollars), final=False)
    if attempt not in led.reservations:
        op.status = OpStatus.SETTLED


def _for_model(ev: JobReported) -> dict[str, Any]:
    """A final report as a tool result: ok with its fields, or an error with its code."""
    fields = {k: v for k, v in ev.result.items() if k != "status"}
    if ev.status is JobStatus.DONE:
        return {"status": "ok", **fields}
    code = "job_canceled" if ev.status is JobStatus.CANCELED else "job_failed"
    return {"status": "error", "code": fields.pop("code", code), **fields}


def on_input(draft: Draft, ev: InputGiven) -> None:
    """An answer to a job's request: it must come from one of the agent's reviewers and
    name the pending request's id; then it is recorded and sent. Anything else is refused
    and changes nothing (an answer already given is ignored)."""
    rec = draft.rec
    op = _job_op(draft, ev.call_id)
    job = op.job
    assert job is not None
    if ev.input_id in job.answered:
        ignore(draft, op, op.attempts[-1], "duplicate")
        return
    if ev.given_by not in draft.ctx.agent.reviewers:
        raise UnknownReference(
            f"job {ev.call_id}: {ev.given_by!r} may not answer its input",
            code="not_a_reviewer",
            field="given_by",
        )
    request = job.input_request
    if rec.state not in LIVE or not op.open or request is None or job.handle is None:
        raise UnknownReference(
            f"job {ev.call_id} asks for no input", code="no_input_request", field="call_id"
        )
    if request.input_id != ev.input_id:
        raise UnknownReference(
            f"job {ev.call_id} asks for input {request.input_id!r}, not {ev.input_id!r}",
            code="wrong_input",
            field="input_id",
        )
    job = tool_job_polls.update(
        op,
        input_request=None,
        answered=[*job.answered, ev.input_id],
        status=JobStatus.RUNNING,
    )
    tool_job_polls.update(op, next_poll_at=tool_job_polls.schedule(draft, op, job.polls))
    draft.row(
        RowKind.TOOL,
        call_id=op.call_id,
        tool=op.tool,
        outcome="input_given",
        detail={"input_id": ev.input_id, "by": ev.given_by},
    )
    draft.commands.append(
        tool_job_polls.job_command(GiveInput, op, input_id=ev.input_id, answer=ev.answer)
    )
