"""Asynchronous tool jobs as declared and as recorded: the policy, the status, the backend.

A tool that declares a :class:`JobPolicy` is a job: dispatching it starts it and returns a
handle at once; its result comes back later as a report (``kernel.events.JobReported``), by
push or because the runner polled on the kernel's schedule. The operation table holds a
:class:`JobState` for each, so the trajectory waits in WAITING_TOOL holding no worker.
Design: docs/adr/0220-async-jobs.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from kernel.fastmodel import Mutable, pinned_values
from kernel.modeljson import json_native


@pinned_values
class OnPause(StrEnum):
    """What a pause does to a job already running (seed 004 10.5.2)."""

    FINISH = "finish"  # let it run under its existing limits; its report settles it
    CANCEL = "cancel"  # ask the backend to stop it; the outcome it confirms is recorded


@pinned_values
class JobStatus(StrEnum):
    """Where a job stands, as its reports (or its start) said."""

    STARTING = "starting"  # registered and sent; no handle heard yet
    RUNNING = "running"
    NEEDS_INPUT = "needs_input"  # it asked for input: see the operation's input request
    DONE = "done"
    FAILED = "failed"
    CANCELED = "canceled"


#: The statuses after which a job reports nothing new (but may still owe its bill).
FINAL = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELED})


@dataclass(frozen=True)
class JobPolicy:
    """How a job tool is supervised: its polling schedule and what a pause does to it.

    The n-th poll after the start is due ``min(poll_s * backoff**n, max_poll_s)`` seconds
    after the one before, never later than the job's deadline (so the deadline is noticed);
    after ``max_polls`` the kernel polls no more and the job's bill waits for a push report
    or the reconciler. The job's deadline is its tool's ``timeout_s`` from the start, cut to
    what the run's clocks have left.
    """

    poll_s: float = 5.0
    backoff: float = 2.0
    max_poll_s: float = 60.0
    max_polls: int = 100
    on_pause: OnPause = OnPause.FINISH

    def __post_init__(self) -> None:
        if self.poll_s <= 0 or self.max_poll_s < self.poll_s:
            raise ValueError("job policy: need 0 < poll_s <= max_poll_s")
        if self.backoff < 1 or self.max_polls < 1:
            raise ValueError("job policy: need backoff >= 1 and max_polls >= 1")

    def interval(self, polls: int) -> float:
        """The wait before the next poll, after ``polls`` polls."""
        return float(min(self.poll_s * self.backoff ** min(polls, 64), self.max_poll_s))


@json_native
class InputRequest(BaseModel):
    """What a job asked for before it can go on: a structured pending dependency, answered
    only by an authorised ``InputGiven`` naming its ``input_id`` (never by log text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_id: str = Field(..., min_length=1, max_length=200)
    prompt: str = Field("", max_length=2000)
    asks: dict[str, Any] = Field(default_factory=dict)  # e.g. a JSON schema of the answer


@json_native
class JobState(Mutable):
    """A job's entry beside its operation: handle, status, schedule, its pending input.

    The kernel only ever replaces it (``model_copy``), so record versions may share it."""

    model_config = ConfigDict(extra="forbid")

    # Times are whole microseconds of the injected clock: an operation sits in a container of
    # the record, which orjson writes as pydantic does only when it holds no float.
    status: JobStatus = JobStatus.STARTING
    handle: str | None = None
    started_us: int
    deadline_us: int  # past it, a job not yet final is cancelled and the run stops (deadline)
    next_poll_us: int | None = None  # None: nothing to poll (no handle, input, or final)
    polls: int = 0
    seq: int = -1  # the highest report number accepted (backends that number their reports)
    charged: Decimal = Decimal(0)  # dollars the reports settled so far (cumulative)
    input_request: InputRequest | None = None
    answered: list[str] = Field(default_factory=list)  # input ids already answered
    cancel_us: int | None = None  # when the kernel asked the backend to stop it

    @property
    def deadline(self) -> float:
        """The job's deadline, in seconds."""
        return seconds(self.deadline_us)

    @property
    def next_poll_at(self) -> float | None:
        """When the next poll is due, in seconds (None: none is)."""
        return None if self.next_poll_us is None else seconds(self.next_poll_us)

    @property
    def cancel_requested(self) -> bool:
        """True once the kernel asked the backend to stop the job."""
        return self.cancel_us is not None


def micros(t: float) -> int:
    """A clock reading in whole microseconds."""
    return round(t * 1_000_000)


def seconds(us: int) -> float:
    """Whole microseconds as a clock reading."""
    return us / 1_000_000


@dataclass(frozen=True)
class JobUpdate:
    """One report a backend gives of a job (a poll's answer, or a push).

    ``charge`` is the job's cumulative bill so far in dollars (None: no billing evidence);
    ``seq`` the backend's report number, growing per job, when it numbers them."""

    status: JobStatus
    result: dict[str, Any] = field(default_factory=dict)
    charge: Decimal | None = None
    input_request: InputRequest | None = None
    seq: int | None = None


@runtime_checkable
class JobBackend(Protocol):
    """Runs job tools: start returns a handle fast; the job reports later.

    Contract: ``start`` under an idempotency key starts at most one job per key (a repeated
    key returns the same handle), so a start re-sent after a lost answer cannot run a job
    twice. ``poll`` answers the reports it has for the handle, in the order it has them
    (possibly repeated: the kernel ignores what it already heard). ``cancel`` asks the job
    to stop and returns at once; the job's final report (its bill) comes later. ``give_input``
    delivers an answer to the input request it names.
    """

    def start(
        self, user: str, tool: str, args: dict[str, Any], key: str, timeout_s: float, *, fence: int
    ) -> tuple[str, float]:
        """Start the job under ``key``; return (handle, seconds spent)."""
        ...

    def poll(self, handle: str) -> tuple[list[JobUpdate], float]:
        """The job's reports; return (updates, seconds spent)."""
        ...

    def cancel(self, handle: str) -> float:
        """Ask the job to stop; return the seconds spent asking."""
        ...

    def give_input(self, handle: str, input_id: str, answer: Any) -> float:
        """Deliver ``answer`` to the job's request ``input_id``; return the seconds spent."""
        ...
