"""What the API shows: trajectories, held approvals and spend, as response models built from
records. Nothing here reads or writes; each builder is a function of one record."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel.amounts import ZERO, Dimension, tool_call_liability
from kernel.record import ControlKind, TrajectoryRecord
from kernel.states import LifecycleState
from kernel.tools import Catalog

_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class Strict(BaseModel):
    """A request body: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class JobRequest(Strict):
    """``POST /v1/trajectories``: what to run and for whom; never the tenant (from the key)."""

    agent: str = Field(min_length=3, max_length=300, description="MODULE:AGENT, allow-listed")
    goal: str = Field(min_length=1, max_length=20_000)
    user: str = Field(min_length=1, max_length=200, description="the end user the run acts for")
    budget: dict[str, int | float | str] = Field(
        default_factory=dict, max_length=16, description="budget overrides, e.g. max_steps"
    )
    service_class: str | None = Field(None, max_length=64)


class ControlRequest(Strict):
    """``POST /v1/trajectories/{id}/{control}``: optional instructions (interrupt)."""

    instructions: str | None = Field(None, max_length=4000)


class DecisionRequest(Strict):
    """``POST /v1/trajectories/{id}/approvals/{approval_id}``: exactly what was reviewed."""

    decision: Literal["approve", "deny"]
    version: int = Field(ge=1, description="held_version of the approval as shown")
    digest: str = Field(min_length=1, max_length=128, description="digest as shown")
    comment: str = Field("", max_length=2000, description="the reviewer's words, kept")


class Spend(BaseModel):
    """One budget dimension: the allowance against what was spent and what is reserved."""

    allowance: str
    spent: str
    reserved: str


class Changed(BaseModel):
    """A value the held call would change, before and after, as the tool can say."""

    name: str
    before: Any
    after: Any


class HeldApproval(BaseModel):
    """A proposal held for a reviewer: what to name in the decision, and what it would do."""

    approval_id: str
    trajectory_id: str
    version: int
    digest: str
    tool: str
    arguments: dict[str, Any]
    held_at: float
    expires_at: float
    status: str
    reserves: dict[str, str] | None = Field(
        None, description="what dispatching it would reserve, per budget dimension"
    )
    changes: list[Changed] = Field(
        default_factory=list, description="what it would change, where its tool can say"
    )
    reason: str = Field(
        "approval", description="why it waits: approval (for a reviewer), freeze or read_only"
    )


class Waiting(BaseModel):
    """A call not sent yet for want of capacity (backpressure): a tool call its gate has no
    room for, or the next model call while its provider refuses ("not now")."""

    call_id: str
    tool: str
    on: str = Field(
        description="what it waits for: a tool's gate (tool/issue_refund) or a model's route"
    )


class Trajectory(BaseModel):
    """One trajectory as its tenant sees it."""

    trajectory_id: str
    state: str
    version: int
    agent: str
    user: str
    goal: str
    submitted_at: float
    stop_reason: str | None
    closing_message: str | None
    closing_report: str | None = None  # what its agent's closing step wrote, if it declares one
    turn: int
    budget: dict[str, Spend]
    held_approval: HeldApproval | None
    pending_control: str | None
    waiting: list[Waiting] = Field(
        default_factory=list, description="calls not sent yet for want of capacity"
    )


class Submitted(BaseModel):
    """A job accepted (or the one an idempotency key already named)."""

    trajectory_id: str
    version: int
    state: str
    created: bool


class Page(BaseModel):
    """A page of trajectories; ``next_cursor`` is None on the last page."""

    items: list[Trajectory]
    next_cursor: str | None


class Approvals(BaseModel):
    """Every approval held in the caller's tenant."""

    items: list[HeldApproval]


class Acknowledged(BaseModel):
    """A control request or a decision carried out."""

    trajectory_id: str
    version: int
    state: str
    detail: dict[str, Any]


class Usage(BaseModel):
    """One tenant's share of the admitted charge against its weight, its backlog and waits.

    A tenant is ``backlogged`` while it has READY work queued; one with nothing queued is owed
    no share, so an admitted share below its weight's is no unfairness then. ``owed_share`` is
    its weight over the weights of the tenants backlogged now: what the round-robin owes it
    while they all stay so (None when it is not backlogged, or when the key sees only its own
    tenant, which must learn nothing of the others' queues).
    """

    tenant: str
    weight: float
    weight_share: float
    admitted_share: float
    admissions: int
    backlog: int
    backlogged: bool
    owed_share: float | None
    wait_p50_s: float | None
    wait_p99_s: float | None


class SharesAt(BaseModel):
    """The admitted shares in one span of time: each tenant's part of the charge admitted
    from ``start`` to ``end`` (epoch seconds; empty when nothing was admitted), and the part
    of those admissions made while every tenant had work queued (``contended``), when shares
    should follow the weights."""

    start: float
    end: float
    admissions: int
    contended: float | None
    shares: dict[str, float]


class UsageHistory(BaseModel):
    """The shares over the span of the last admissions the fleet keeps, oldest first."""

    tenants: list[str]
    buckets: list[SharesAt]


CONTROLS = tuple(k.value for k in ControlKind)


def held_of(rec: TrajectoryRecord, catalog: Catalog | None = None) -> HeldApproval | None:
    """The record's held proposal, or None; with the agent's ``catalog``, what it would
    reserve and change too."""
    held = rec.held
    if held is None:
        return None
    spec = catalog.get(held.tool) if catalog is not None else None
    reserves = changes = None
    if spec is not None:
        liability = tool_call_liability(spec.liability or ZERO)
        reserves = {dim.value: str(liability.get(dim)) for dim in Dimension}
        changes = [
            Changed(name=c.name, before=c.before, after=c.after)
            for c in spec.changes(held.args, rec.facts)
        ]
    return HeldApproval(
        approval_id=held.approval_id,
        trajectory_id=rec.trajectory_id,
        version=held.held_version,
        digest=held.digest,
        tool=held.tool,
        arguments=held.args,
        held_at=held.held_at,
        expires_at=held.expires_at,
        status=held.status.value,
        reserves=reserves,
        changes=changes or [],
        reason=held.reason.value,
    )


def trajectory_of(rec: TrajectoryRecord, catalog: Catalog | None = None) -> Trajectory:
    """The view of one record (its held proposal's reservation and changes with ``catalog``)."""
    budget = {}
    for dim in Dimension:
        acct = rec.ledger.account(dim)
        budget[dim.value] = Spend(
            allowance=str(acct.allowance), spent=str(acct.actual), reserved=str(acct.reserved)
        )
    return Trajectory(
        trajectory_id=rec.trajectory_id,
        state=rec.state.value,
        version=rec.record_version,
        agent=rec.agent,
        user=rec.user,
        goal=rec.goal,
        submitted_at=rec.submitted_at,
        stop_reason=rec.stop_reason.value if rec.stop_reason else None,
        closing_message=rec.closing_message,
        closing_report=rec.closing_report,
        turn=rec.turn,
        budget=budget,
        held_approval=held_of(rec, catalog),
        pending_control=rec.pending_control.kind.value if rec.pending_control else None,
        waiting=[
            Waiting(call_id=op.call_id, tool=op.tool or "", on=op.waiting)
            for op in rec.operations.values()
            if op.waiting is not None and op.open
        ]
        + _model_waiting(rec),
    )


def _model_waiting(rec: TrajectoryRecord) -> list[Waiting]:
    """The next model call, while its provider refuses ("not now"): READY, asked again once
    admission lets it through the route's gate (:mod:`kernel.backpressure`)."""
    if rec.state is not LifecycleState.READY or rec.rejected_by is None:
        return []
    call = f"{rec.trajectory_id}/m{rec.turn + 1}"
    return [Waiting(call_id=call, tool="model", on=f"{rec.rejected_by} ({rec.rejections} refused)")]
