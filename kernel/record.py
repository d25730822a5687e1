"""The trajectory record: the per-trajectory control state that only reins writes.

Field groups follow seed 004 table 2: identity and task, control, continuation (plan, facts,
last observation), limits and accounting (budget, ledger, clocks), authority (grants),
invocations and obligations (the operation table), held approval. The model never supplies any
field: identity comes from the application, facts only from allow-listed tool-result fields.

The JSON form round-trips exactly and carries ``schema_version``; a record of an unknown
schema version is refused on load, never coerced.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.amounts import Amounts
from kernel.budget import Budget
from kernel.errors import UnsupportedSchema
from kernel.fastmodel import Mutable, construct, pinned_values, shallow_copy
from kernel.job_specs import JobState
from kernel.ledger import Ledger
from kernel.modeljson import json_native, model_json
from kernel.scratchpad import Scratchpad
from kernel.states import LifecycleState, StopReason

SCHEMA_VERSION = 8  # 2: the ledger's overrun; 3: the scratchpad and episodes; 4: the class;
# 5: the recoveries count and the highest fence; 6: the grants' freeze, a hold's reason, the
# closing step and its report; 7: what a tool call waits for, and model calls refused in a row;
# 8: an operation's job (handle, status, poll schedule, pending input)
#: Older records read as an 8 without what they lack (no overrun, no scratchpad, the tenant's
#: first class, no recoveries, not frozen, holds for a reviewer, no closing step, no tool call
#: waiting, no refusals, no jobs).
READABLE_SCHEMAS = frozenset({1, 2, 3, 4, 5, 6, 7, SCHEMA_VERSION})

JsonScalar = str | int | float | bool | None


@pinned_values
class StepStatus(StrEnum):
    """Status of one plan step."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"
    SUPERSEDED = "superseded"  # an operator's interrupt replaced it: the model plans anew


@json_native
class PlanStep(Mutable):
    """One step of the live plan: a tool, its prerequisites and its status."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tool: str
    depends_on: list[str] = Field(default_factory=list)
    status: StepStatus = StepStatus.PENDING
    args: dict[str, Any] | None = None  # set when the plan is executed without the model


@pinned_values
class OpKind(StrEnum):
    """What an operation calls."""

    MODEL = "model"
    TOOL = "tool"


@pinned_values
class OpStatus(StrEnum):
    """Where an operation stands in its settlement lifecycle."""

    REGISTERED = "registered"  # admitted and reserved; may be in flight
    UNKNOWN = "unknown"  # a deadline passed without evidence; the reservation stays
    SETTLED = "settled"  # evidence arrived and settled the reservation
    HANDED_OFF = "handed_off"  # transferred to a named owner with evidence and reservation


@pinned_values
class SettlementOwner(StrEnum):
    """Who owes an open operation's settlement: the kernel while the run lives, then the
    reconciler it is handed to at the stop."""

    KERNEL = "kernel"
    RECONCILER = "reconciler"


@pinned_values
class EscalationStage(StrEnum):
    """A stage of staged escalation (seed 004 table 9), once entered."""

    STEER = "steer"  # the view asks for a smaller step or the final report
    RESTRICT = "restrict"  # grants narrowed to read-only tools
    FINALIZE = "finalize"  # the next call no longer fits beside the reserve: the run closes


@json_native
class Operation(Mutable):
    """One entry of the operation table: a registered model or tool call (seed 004 10.3)."""

    model_config = ConfigDict(extra="forbid")

    op_id: str
    call_id: str
    kind: OpKind
    attempts: list[str]
    idempotency_key: str
    epoch: int
    reservation: Amounts
    settlement_owner: SettlementOwner = SettlementOwner.KERNEL
    status: OpStatus = OpStatus.REGISTERED
    eligible: bool = True
    tool: str | None = None
    args: dict[str, Any] | None = None
    plan_step: str | None = None
    evidence: dict[str, Any] | None = None
    turn: int = 0  # the turn that registered it (its wait's batch)
    waiting: str | None = None  # not sent yet: the capacity (a gate) it waits for
    job: JobState | None = None  # an asynchronous job's handle and reports (kernel.jobs)

    @property
    def open(self) -> bool:
        """True while the operation still owes a settlement."""
        return self.status in (OpStatus.REGISTERED, OpStatus.UNKNOWN)

    @classmethod
    def model_call(cls, call_id: str, attempt: str, epoch: int, reservation: Amounts) -> Operation:
        """A model call registered with its first attempt (its key is its call id)."""
        return construct(
            cls,
            op_id=call_id,
            call_id=call_id,
            kind=OpKind.MODEL,
            attempts=[attempt],
            idempotency_key=call_id,
            epoch=epoch,
            reservation=reservation,
        )


@pinned_values
class ApprovalStatus(StrEnum):
    """Where a held proposal stands."""

    HELD = "held"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


@pinned_values
class HoldReason(StrEnum):
    """Why a proposed action is held instead of sent: a reviewer must decide it, or an
    operator's freeze or read-only grant keeps writes waiting until it is lifted."""

    APPROVAL = "approval"
    FREEZE = "freeze"
    READ_ONLY = "read_only"


@json_native
class HeldProposal(Mutable):
    """An exact proposed action frozen for review (approval escrow, seed 004 10.7)."""

    model_config = ConfigDict(extra="forbid")

    approval_id: str
    held_version: int
    plan_revision: int
    expires_at: float
    digest: str
    tool: str
    args: dict[str, Any]
    plan_step: str | None = None
    call_key: str
    status: ApprovalStatus = ApprovalStatus.HELD
    held_at: float = 0.0
    decided_at: float | None = None  # when a decision (or expiry, or withdrawal) closed it
    reason: HoldReason = HoldReason.APPROVAL  # only an approval hold is for a reviewer


@json_native
class ClosingStep(Mutable):
    """The funded closing step of a run in FINALIZING (seed 004 10.4.4): its model call, when
    the stop was decided, and the end of its own time allowance."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    since: float
    until: float  # since + the budget's finalize_s: past it the run ends without the report
    detail: str | None = None  # the stop's detail, written in the STOP row when the run ends


@pinned_values
class ControlKind(StrEnum):
    """Control actions an authorised operator may request (seed 004 table 6)."""

    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    KILL = "kill"
    INTERRUPT = "interrupt"


@json_native
class PendingControl(BaseModel):
    """A control request that blocks admission until it is carried out."""

    model_config = ConfigDict(extra="forbid")

    kind: ControlKind
    request_id: str
    requested_by: str
    at: float


@json_native
class Grants(BaseModel):
    """Which tools a trajectory may use; checked at every admission, whatever the model says."""

    model_config = ConfigDict(extra="forbid")

    tools: list[str] | None = None  # None: every tool of the agent profile
    read_only: bool = False  # no write tool is dispatched: writes wait (escalation: refused)
    denied_targets: list[str] = Field(default_factory=list)
    frozen: bool = False  # an operator's freeze: writes wait until it is lifted

    def allows(self, tool: str, is_write: bool, target: str | None = None) -> bool:
        """True when a call to ``tool`` (on ``target``) is within the grants."""
        if self.tools is not None and tool not in self.tools:
            return False
        if is_write and self.read_only:
            return False
        return not (target is not None and target in self.denied_targets)


@json_native
class ErrorStreak(BaseModel):
    """The same recoverable error kind, counted while it repeats in a row."""

    model_config = ConfigDict(extra="forbid")

    kind: str | None = None
    count: int = 0


@json_native
class TrajectoryRecord(Mutable):
    """The authoritative control state of one trajectory."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    # identity and task: set by the application, never by the model
    trajectory_id: str
    tenant: str
    user: str
    parent_id: str | None = None
    goal: str
    agent: str
    service_class: str | None = None  # its tenant's class on every turn (None: the first)
    # control
    state: LifecycleState = LifecycleState.READY
    record_version: int = 1
    control_epoch: int = 0
    pending_control: PendingControl | None = None
    stop_reason: StopReason | None = None
    closing_message: str | None = None
    closing: ClosingStep | None = None  # the closing step, once one was admitted
    closing_report: str | None = None  # what the closing step wrote (never the message)
    # continuation
    plan: list[PlanStep] = Field(default_factory=list)
    plan_revision: int = 0
    facts: dict[str, JsonScalar] = Field(default_factory=dict)
    last_observation: dict[str, Any] | None = None
    scratchpad: Scratchpad | None = None  # the agent's past steps, when its profile keeps them
    episodes: list[dict[str, Any]] | None = None  # earlier runs recalled at submission
    # limits and accounting
    budget: Budget
    ledger: Ledger
    submitted_at: float
    active_s: float = 0.0
    # progress evidence
    turn: int = 0  # model calls admitted so far (the seeds' "steps")
    turn_signature: str | None = None  # the progress signature when this turn was admitted
    tool_dispatches: int = 0  # tool call attempts sent so far
    chain_length: int = 0  # rows written to the execution chain
    seen: dict[str, int] = Field(default_factory=dict)
    stalls: int = 0
    error_streak: ErrorStreak = Field(default_factory=ErrorStreak)
    recoveries: int = 0  # turns recovered since a turn last ended on its own
    # model calls a provider refused in a row ("not now", nothing used), since one was answered
    rejections: int = 0
    rejected_by: str | None = None  # the route that refused the last of them
    fence: int = 0  # the highest fencing token given out to a backend
    # authority, obligations, held approval
    grants: Grants = Field(default_factory=Grants)
    operations: dict[str, Operation] = Field(default_factory=dict)
    held: HeldProposal | None = None
    approval_requests: int = 0
    # supervised waiting and escalation
    wait_deadline: float | None = None
    job_logs: dict[str, list[str]] = Field(default_factory=dict)
    escalation: EscalationStage | None = None

    @classmethod
    def create(
        cls,
        *,
        trajectory_id: str,
        tenant: str,
        user: str,
        goal: str,
        agent: str,
        budget: Budget,
        now: float,
        parent_id: str | None = None,
        grants: Grants | None = None,
        service_class: str | None = None,
    ) -> TrajectoryRecord:
        """A new record at version 1 in READY, its ledger opened from the budget."""
        fields = {
            "trajectory_id": trajectory_id,
            "tenant": tenant,
            "user": user,
            "goal": goal,
            "agent": agent,
            "parent_id": parent_id,
            "service_class": service_class,
            "budget": budget,
            "ledger": Ledger.open(budget),
            "submitted_at": now,
        }
        texts = (trajectory_id, tenant, user, goal, agent)
        if (
            all(type(t) is str for t in texts)
            and (parent_id is None or type(parent_id) is str)
            and (service_class is None or type(service_class) is str)
            and type(budget) is Budget
            and type(now) is float
            and (grants is None or type(grants) is Grants)
        ):
            # What validation would check, checked: the record is built without it.
            return construct(cls, **fields, grants=grants or construct(Grants))
        return cls(**fields, grants=grants or Grants())

    def clone(self) -> TrajectoryRecord:
        """A copy the kernel may change without touching this record.

        Cheaper than a deep copy. Shared: frozen values (budget, amounts), what the kernel
        only ever replaces (grants, error streak, job logs, evidence), the ledger's accounts
        (a write replaces one), the plan (the kernel copies a step before changing it:
        ``Draft.own_step``) and settled operations no longer eligible for a result (nothing
        changes them again; a handed-off one may still be settled, so it is copied). Every
        other container the kernel changes in place is copied. The step function's tests
        check that its input is never changed.
        """
        new = shallow_copy(self)
        d = new.__dict__  # the copy's fields, read and replaced here straight in its __dict__
        d["facts"] = d["facts"].copy()
        d["ledger"] = d["ledger"].clone()
        d["seen"] = d["seen"].copy()
        ops = d["operations"] = d["operations"].copy()
        for k, op in ops.items():
            fields = op.__dict__
            if fields["eligible"] or fields["status"] is not OpStatus.SETTLED:  # it may change
                op = ops[k] = shallow_copy(op)
                op.__dict__["attempts"] = fields["attempts"].copy()
        if d["held"] is not None:
            d["held"] = shallow_copy(d["held"])
        if d["scratchpad"] is not None:
            d["scratchpad"] = d["scratchpad"].clone()
        return new

    # --- serialisation ---------------------------------------------------------------------

    def to_json(self) -> bytes:
        """The canonical JSON bytes of the record: exactly its pydantic serializer's."""
        return model_json(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> TrajectoryRecord:
        """Parse a record; refuse one whose schema version this build does not know."""
        try:  # the common case: one parse and validation in pydantic-core
            record = cls.model_validate_json(data)
        except ValidationError:
            record = None  # diagnose below: an unknown schema, or a genuinely bad record
        if record is not None and record.schema_version == SCHEMA_VERSION:
            return record
        raw = json.loads(data)
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if version not in READABLE_SCHEMAS:
            tid = raw.get("trajectory_id", "?") if isinstance(raw, dict) else "?"
            raise UnsupportedSchema(
                f"trajectory {tid}: schema version {version!r} is not supported "
                f"(this build reads versions {sorted(READABLE_SCHEMAS)})"
            )
        upgraded = cls.model_validate(raw)
        upgraded.schema_version = SCHEMA_VERSION  # written back as this build writes it
        return upgraded

    # --- derived views -------------------------------------------------------------------

    @property
    def open_operations(self) -> list[Operation]:
        """Operations that still owe a settlement, in registration order."""
        return [op for op in self.operations.values() if op.open]
