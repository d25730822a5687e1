"""Tool calls sent: registered and reserved first, then dispatched, under one key per effect.

The shared path of a model's tool proposal, an approved held action and a plan's next steps
(:mod:`kernel.shapes`): a batch that does not fit the budget registers nothing and ends the run.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from kernel import tool_job_polls
from kernel.amounts import NOTHING, ZERO, Dimension, tool_call_liability
from kernel.chain import RowKind
from kernel.context import MISFIT_STOP, Draft
from kernel.errors import AdmissionRefused
from kernel.events import DispatchTool, HoldForApproval
from kernel.fastmodel import construct
from kernel.lifecycle import Cause, clock_stop, time_left, transition
from kernel.progress import digest
from kernel.record import HeldProposal, Operation, OpKind, TrajectoryRecord
from kernel.states import LifecycleState
from kernel.tools import ToolKind, ToolSpec

S = LifecycleState

#: One call to send: the tool, its validated arguments, and the plan step it carries out.
Call = tuple[ToolSpec, dict[str, Any], str | None]


def call_key(
    draft: Draft, spec: ToolSpec, args: dict[str, Any], plan_step: str | None, index: int
) -> str:
    """The idempotency key of a call. A write's derives from what it does (the trajectory, the
    plan step when there is one, the tool and its canonical arguments), so the same write
    proposed twice is one effect under one key; a read's names its plan step or its turn, since
    reading again is a new read."""
    rec = draft.rec
    if spec.kind is ToolKind.WRITE:
        step = f"{plan_step}:" if plan_step is not None else ""
        return f"{rec.trajectory_id}:{step}{spec.name}:{digest([spec.name, args])}"
    if plan_step is not None:
        return f"{rec.trajectory_id}:{plan_step}"
    suffix = f".{index}" if index else ""
    return f"{rec.trajectory_id}:adhoc{rec.turn}{suffix}"


def same_effect(rec: TrajectoryRecord, key: str) -> Operation | None:
    """The tool operation of this trajectory already registered under ``key``, if any."""
    for op in rec.operations.values():
        if op.idempotency_key == key and op.kind is OpKind.TOOL:
            return op
    return None


def proposal_digest(tool: str, args: dict[str, Any], target: str, plan_revision: int) -> str:
    """The approval digest of a held proposal (seed 004 10.7.1): it covers the operation, its
    arguments, its target and the plan revision, so changing any of them voids the approval."""
    proposal = {
        "operation": tool,
        "arguments": args,
        "target": target,
        "plan_revision": plan_revision,
    }
    return digest(proposal, size=32)


def review_request(
    draft: Draft, tool: str, args: dict[str, Any], plan_step: str | None, key: str
) -> HeldProposal:
    """Approval escrow: the exact proposal as a request for a reviewer, numbered, with its
    digest and its time to live; the caller puts it in the record and :func:`announce`s it."""
    rec = draft.rec
    rec.approval_requests += 1
    return HeldProposal(
        approval_id=f"{rec.trajectory_id}/ap{rec.approval_requests}",
        held_version=rec.record_version + 1,  # the version the held proposal commits at
        plan_revision=rec.plan_revision,
        expires_at=draft.now + draft.ctx.agent.approval_ttl_s,
        held_at=draft.now,
        digest=proposal_digest(tool, args, key, rec.plan_revision),
        tool=tool,
        args=args,
        plan_step=plan_step,
        call_key=key,
    )


def announce(draft: Draft, held: HeldProposal) -> None:
    """The request's chain row, and the command that tells reviewers of it."""
    draft.row(
        RowKind.APPROVAL,
        tool=held.tool,
        args=held.args,
        outcome="held",
        detail={"approval_id": held.approval_id, "digest": held.digest},
    )
    draft.commands.append(
        HoldForApproval(
            approval_id=held.approval_id,
            held_version=held.held_version,
            digest=held.digest,
            tool=held.tool,
            args=held.args,
            expires_at=held.expires_at,
        )
    )


def refusal(approval_id: str, reason: str) -> dict[str, Any]:
    """The observation a withheld action returns to the model (seed 004 section 10.7.2)."""
    return {
        "approval_id": approval_id,
        "status": "REFUSED",
        "reason": reason,
        "dispatch_status": "not_sent",
    }


def dispatch(
    draft: Draft,
    calls: list[Call],
    cause: Cause | None,
    approval_digest: str | None = None,
    keys: list[str] | None = None,
) -> None:
    """Register and reserve every call, take the edge to WAITING_TOOL (or stay there when
    ``cause`` is None: a plan's next steps), then emit the dispatches. A batch that does not
    fit the budget registers nothing and ends the run with the matching stop.
    """
    rec = draft.rec
    ran_out = clock_stop(rec, draft.now)
    if ran_out is not None:  # no call is sent once a clock has run out (seed 004 10.9.1)
        draft.stop(ran_out, f"{len(calls)} tool calls not sent: the {ran_out.value} ran out")
        return
    planned = _operations(draft, calls, keys)
    try:
        if cause is None:
            _register(planned, rec)
        else:
            admit = partial(_register, planned)
            transition(rec, S.WAITING_TOOL, draft.decide(cause), draft.now, admit=admit)
    except AdmissionRefused as refused:
        draft.stop(MISFIT_STOP[Dimension(refused.dimension)])
        return
    wait_s = draft.ctx.agent.wait.deadline_s
    if cause is not None and wait_s is not None:
        rec.wait_deadline = draft.now + wait_s
    timeout = time_left(rec, draft.now)
    for op, (spec, _args, _step) in zip(planned, calls, strict=True):
        if spec.job is not None:  # registered above; the job's state goes with its start
            draft.commands.append(
                tool_job_polls.start(draft, op, spec, min(spec.timeout_s, timeout), approval_digest)
            )
            continue
        draft.commands.append(
            construct(
                DispatchTool,
                call_id=op.call_id,
                attempt_id=op.attempts[0],
                tool=spec.name,
                args=op.args or {},
                idempotency_key=op.idempotency_key,
                timeout_s=min(spec.timeout_s, timeout),
                approval_digest=approval_digest,
                fence=draft.fence,
            )
        )


def _operations(draft: Draft, calls: list[Call], keys: list[str] | None) -> list[Operation]:
    """The operations ``calls`` will be, numbered after the run's tool calls so far; nothing
    is registered yet. ``keys`` (one per call) overrides the idempotency keys."""
    rec = draft.rec
    planned: list[Operation] = []
    tool_ops = sum(1 for op in rec.operations.values() if op.kind is OpKind.TOOL)
    for j, (spec, args, plan_step) in enumerate(calls):
        call_id = f"{rec.trajectory_id}/t{tool_ops + j + 1}"
        planned.append(
            construct(
                Operation,
                op_id=call_id,
                call_id=call_id,
                kind=OpKind.TOOL,
                attempts=[f"{call_id}/a1"],
                idempotency_key=keys[j] if keys else call_key(draft, spec, args, plan_step, j),
                epoch=rec.control_epoch,
                reservation=tool_call_liability(spec.liability or ZERO),
                tool=spec.name,
                args=args,
                plan_step=plan_step,
                turn=rec.turn,
            )
        )
    return planned


def _register(planned: list[Operation], rec: TrajectoryRecord) -> None:
    """Reserve every planned operation in ``rec``'s ledger and register it, all or none: if one
    is refused, the reservations already made are booked at nothing and the refusal raised."""
    done: list[str] = []
    try:
        for op in planned:
            rec.ledger.admit(op.attempts[0], op.reservation)
            done.append(op.attempts[0])
    except AdmissionRefused:
        for attempt in done:  # not sent: nothing left the process, so nothing is owed
            rec.ledger.book(attempt, NOTHING)
        raise
    for op in planned:
        rec.operations[op.op_id] = op
    rec.tool_dispatches += len(planned)
