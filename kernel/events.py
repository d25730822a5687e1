"""What goes into the step function (events) and what comes out (commands).

Events are validated facts from outside: a reply, a result, a decision, a control request, the
passing of time. Commands are what the kernel asks a runner to do; a runner carries them out
and reports back with events. Model text is only ever a proposal inside a reply event.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernel.amounts import Usage
from kernel.fastmodel import pinned_values
from kernel.job_specs import InputRequest, JobStatus
from kernel.record import ControlKind, Grants
from kernel.states import LifecycleState, StopReason


@pinned_values
class ReplyStatus(StrEnum):
    """The normalised status of one model call (seed 004 table 4)."""

    COMPLETED = "COMPLETED"
    TRUNCATED = "TRUNCATED"
    REFUSED = "REFUSED"
    REJECTED = "REJECTED"
    CANCELED = "CANCELED"
    TRANSPORT_FAILURE = "TRANSPORT_FAILURE"
    FAULTED = "FAULTED"


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    now: float  # the injected clock's reading when the event was observed


class Admit(_Event):
    """A request to admit the trajectory's next model call (from the admitter or runner)."""

    type: Literal["admit"] = "admit"


class ModelReplied(_Event):
    """A model call ended. ``content`` is the parsed proposal, or None if there was none."""

    type: Literal["model_replied"] = "model_replied"
    call_id: str
    status: ReplyStatus
    content: Any = None  # the proposal as JSON-like data; validated by the kernel, not here
    raw: str | None = None  # the raw text, kept for diagnostics
    usage: Usage | None = None  # None: no usage evidence (the reservation stays)
    latency_s: float = Field(0.0, ge=0)
    timed_out: bool = False
    retry_after_s: float | None = None
    route: str | None = None  # the provider route that answered (a routed model's)
    fell_back: tuple[str, ...] = ()  # routes tried before it, each "route: status"


class ToolResulted(_Event):
    """A tool call ended: authentic evidence correlated by call and attempt."""

    type: Literal["tool_resulted"] = "tool_resulted"
    call_id: str
    attempt_id: str
    result: dict[str, Any]
    latency_s: float = Field(0.0, ge=0)
    charge: Decimal | None = None  # dollars billed; None = no billing evidence
    looked_up: bool = False  # the answer of a lookup, not of a dispatch


class ApprovalDecided(_Event):
    """A reviewer's decision on a held proposal; it must name id, version and digest."""

    type: Literal["approval_decided"] = "approval_decided"
    approval_id: str
    held_version: int
    digest: str
    reviewer: str
    approve: bool
    comment: str = Field("", max_length=2000)  # the reviewer's words, kept in the chain row


class ControlRequested(_Event):
    """An authenticated operator's control request."""

    type: Literal["control_requested"] = "control_requested"
    kind: ControlKind
    request_id: str
    requested_by: str
    instructions: str | None = None


class ToolDeferred(_Event):
    """A tool call was not sent: the capacity it needs (``gate``, a tool gate's route) had no
    room in time. Nothing happened; the kernel decides whether the call waits on (it is sent
    again under the same attempt) or is dropped. Backpressure, never a result for the model."""

    type: Literal["tool_deferred"] = "tool_deferred"
    call_id: str
    attempt_id: str
    gate: str
    reason: str = ""


class GrantsChanged(_Event):
    """An operator sets a trajectory's grants (tools, read-only, denied targets) or its
    freeze; a field left None is kept as it is."""

    type: Literal["grants_changed"] = "grants_changed"
    request_id: str
    requested_by: str
    grants: Grants | None = None  # replaces tools, read-only and denied targets
    frozen: bool | None = None


class ToolProgress(_Event):
    """A long job's log line or heartbeat: kept, bounded, and never a reason to resume."""

    type: Literal["tool_progress"] = "tool_progress"
    call_id: str
    line: str


class Finalize(_Event):
    """The runtime ends a live trajectory with a stop it decided outside the record (an
    admission limit of the tenant, say). Never from the model; the closing message is built
    from the state as for any other stop."""

    type: Literal["finalize"] = "finalize"
    stop: StopReason
    detail: str = ""


class Recover(_Event):
    """The worker that held this trajectory's turn is gone (its heartbeat lapsed)."""

    type: Literal["recover"] = "recover"
    worker: str = ""


class Reconcile(_Event):
    """The reconciler's pass over what an ended run still owes: each handed-off write whose
    tool can be asked is looked up; whatever cannot be asked is closed at its worst case.
    The reconciler decides when (after a grace for late evidence, on a bounded schedule)."""

    type: Literal["reconcile"] = "reconcile"


class JobStarted(_Event):
    """A job's start was answered: the backend took it under ``handle``."""

    type: Literal["job_started"] = "job_started"
    call_id: str
    attempt_id: str
    handle: str = Field(..., min_length=1, max_length=500)
    latency_s: float = Field(0.0, ge=0)


class JobReported(_Event):
    """A job's report (a poll's answer or a push), correlated by operation and attempt.

    ``epoch`` is the control epoch its start was registered under (echoed from
    :class:`StartJob`); ``seq`` the backend's report number when it numbers them; ``charge``
    the job's cumulative bill in dollars so far (None: no billing evidence). A report the
    record already heard, or one for another attempt or epoch, changes nothing."""

    type: Literal["job_reported"] = "job_reported"
    call_id: str
    attempt_id: str
    epoch: int
    status: JobStatus
    result: dict[str, Any] = Field(default_factory=dict)
    charge: Decimal | None = Field(None, ge=0)
    input_request: InputRequest | None = None
    seq: int | None = Field(None, ge=0)
    latency_s: float = Field(0.0, ge=0)


class InputGiven(_Event):
    """An authorised person answers a job's input request; it must name its input id."""

    type: Literal["input_given"] = "input_given"
    call_id: str
    input_id: str
    answer: Any = None
    given_by: str


class Tick(_Event):
    """Time passed: check the wall clock, wait deadlines and approval expiry."""

    type: Literal["tick"] = "tick"


Event = (
    Admit
    | ModelReplied
    | ToolResulted
    | ToolDeferred
    | ToolProgress
    | JobStarted
    | JobReported
    | InputGiven
    | ApprovalDecided
    | ControlRequested
    | GrantsChanged
    | Finalize
    | Recover
    | Reconcile
    | Tick
)


# --- commands --------------------------------------------------------------------------------


class _Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CallModel(_Command):
    """Send the view to the model; the call is registered and reserved already."""

    type: Literal["call_model"] = "call_model"
    call_id: str
    attempt_id: str
    view: str
    max_output_tokens: int
    timeout_s: float


class DispatchTool(_Command):
    """Run one tool call under its idempotency key; registered and reserved already.

    ``fence`` is the attempt's fencing token: the record version the step that sent it
    commits (its input's version plus one). Every later attempt or lookup of the trajectory
    carries a larger one, so a backend that keeps the highest fence per key refuses a late
    write from an attempt the record has moved past (``kernel.tools.ToolBackend``). 0 only in
    a message of a build before fences, and older than any fence.
    """

    type: Literal["dispatch_tool"] = "dispatch_tool"
    call_id: str
    attempt_id: str
    tool: str
    args: dict[str, Any]
    idempotency_key: str
    timeout_s: float
    approval_digest: str | None = None  # set when a reviewer approved exactly these arguments
    fence: int = 0


class LookupEffect(_Command):
    """Ask the tool's backend whether the effect of ``idempotency_key`` happened; ``fence``
    as for :class:`DispatchTool` (the backend remembers it, so its answer stays true)."""

    type: Literal["lookup_effect"] = "lookup_effect"
    call_id: str
    attempt_id: str
    tool: str
    idempotency_key: str
    fence: int = 0


class StartJob(_Command):
    """Start an asynchronous job (its tool declares a job policy); registered and reserved
    already. The backend answers with a handle at once (:class:`JobStarted`); the job's
    reports come later and carry ``epoch`` back. ``fence`` as for :class:`DispatchTool`."""

    type: Literal["start_job"] = "start_job"
    call_id: str
    attempt_id: str
    tool: str
    args: dict[str, Any]
    idempotency_key: str
    timeout_s: float
    epoch: int
    approval_digest: str | None = None
    fence: int = 0


class PollJob(_Command):
    """Ask a job's backend for its reports; the poll was recorded before it was sent."""

    type: Literal["poll_job"] = "poll_job"
    call_id: str
    attempt_id: str
    handle: str
    epoch: int


class CancelJob(_Command):
    """Ask a job's backend to stop it. Its outcome and bill still come from its report."""

    type: Literal["cancel_job"] = "cancel_job"
    call_id: str
    attempt_id: str
    handle: str | None  # None: not started yet as far as the record knows (cancel by key)
    idempotency_key: str
    tool: str


class GiveInput(_Command):
    """Send an answer to the input request a job made."""

    type: Literal["give_input"] = "give_input"
    call_id: str
    attempt_id: str
    handle: str
    input_id: str
    answer: Any = None


class HoldForApproval(_Command):
    """A proposal is held; tell the reviewers. The trajectory holds no worker meanwhile."""

    type: Literal["hold_for_approval"] = "hold_for_approval"
    approval_id: str
    held_version: int
    digest: str
    tool: str
    args: dict[str, Any]
    expires_at: float


class CancelCall(_Command):
    """Stop a running call (streaming cancellation); its evidence still settles it."""

    type: Literal["cancel_call"] = "cancel_call"
    call_id: str


class Enqueue(_Command):
    """The trajectory is READY: put it back in its tenant's queue."""

    type: Literal["enqueue"] = "enqueue"


class Finish(_Command):
    """The run ended: the terminal state, the stop reason and the closing message."""

    type: Literal["finish"] = "finish"
    state: LifecycleState
    stop: StopReason
    message: str


Command = (
    CallModel
    | DispatchTool
    | LookupEffect
    | StartJob
    | PollJob
    | CancelJob
    | GiveInput
    | HoldForApproval
    | CancelCall
    | Enqueue
    | Finish
)
