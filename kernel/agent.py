"""An agent profile: the model it calls, its prices, its tools, its loop shape, its budget."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kernel.amounts import ModelPrice
from kernel.budget import Budget
from kernel.memory_tools import MemoryPolicy
from kernel.record import TrajectoryRecord
from kernel.scratchpad import ScratchpadPolicy
from kernel.states import StopReason
from kernel.tools import Catalog, ToolBackend


class LoopShape(StrEnum):
    """How the agent interleaves planning and acting (seed 001 section 2)."""

    REACT = "react"
    REWOO = "rewoo"
    PLAN_EXECUTE = "plan_execute"


@dataclass(frozen=True)
class ModelRef:
    """Which model to call, what it costs, and what a call's input holds beyond the view.

    Admission reserves the view's estimated tokens plus what the estimate cannot see: a share
    ``input_margin`` of it (the provider's tokenizer counts differently), ``framing_tokens`` of
    the provider's message framing, and, when ``sends_tool_schemas``, the agent's tool schemas
    as the provider receives them. Usage past the reservation is still booked, as an overrun.
    """

    provider: str  # "scripted", "openai-compatible", "anthropic", "routes", ...
    name: str
    price: ModelPrice
    base_url: str | None = None
    api_key_env: str | None = None
    input_margin: float = 0.1
    framing_tokens: int = 64
    sends_tool_schemas: bool = True
    #: A routed model's price per route (the fleet's document): a reply that names its route
    #: is settled at that route's price; ``price`` is then the dearest of them, reserved.
    route_prices: tuple[tuple[str, ModelPrice], ...] = ()

    def price_of(self, route: str | None) -> ModelPrice:
        """The price a reply through ``route`` is settled at (``price`` for none or unknown)."""
        if route is not None:
            for name, price in self.route_prices:
                if name == route:
                    return price
        return self.price


class WaitKind(StrEnum):
    """When a wait on a batch of tool calls ends (seed 004 10.6.2)."""

    ALL = "all"  # every result, or a terminal disposition for each
    PARTIAL = "partial"  # once ``min_results`` have arrived; the rest are withdrawn


@dataclass(frozen=True)
class WaitPolicy:
    """A declared wait: which results end it, and how long it may last."""

    kind: WaitKind = WaitKind.ALL
    min_results: int = 1
    deadline_s: float | None = None  # the wait's own deadline (a Tick past it withdraws)


@dataclass(frozen=True)
class Escalation:
    """Staged escalation (seed 004 table 9), triggered from the admission terms: how many
    more model calls at the current liability still fit beside the finalization reserve."""

    steer_at_calls: int = 3  # the view shows the remaining allowance and asks for less
    restrict_at_calls: int = 1  # grants narrow to read-only tools


#: The stops after which a declared closing report is written: every stop but completion (the
#: model's final answer is the report; its acceptance check runs before the stop) and a kill
#: (stopped at once, seed 004 10.5.3).
REPORTED_STOPS = frozenset(StopReason) - {StopReason.DONE, StopReason.KILLED}


@dataclass(frozen=True)
class ClosingReport:
    """Closing work an agent declares (seed 004 10.4.4): when a stop is decided, one model
    call in FINALIZING writes the run's report. It is admitted against what the run has left,
    the finalization reserve included, and given the budget's ``finalize_s`` as its own time
    allowance; the run ends when it answers, fails or runs out of that time."""

    instructions: str = (
        "The run is stopping. Do not call tools. Reply with a JSON object "
        '{"type": "report", "text": ...}: what was done, what was not, and why.'
    )
    max_output_tokens: int = 200
    stops: frozenset[StopReason] = REPORTED_STOPS

    def __post_init__(self) -> None:
        if self.max_output_tokens <= 0:
            raise ValueError("closing report: max_output_tokens must be positive")
        if StopReason.DONE in self.stops or StopReason.KILLED in self.stops:
            raise ValueError("closing report: done and killed end without one")


Acceptance = Callable[["TrajectoryRecord"], str | None]
"""An acceptance check: None when the claimed completion holds, else the reason it does not."""


@dataclass(frozen=True)
class AgentProfile:
    """Everything the kernel needs to know about an agent; built by the user's module."""

    name: str
    model: ModelRef
    catalog: Catalog
    loop: LoopShape = LoopShape.REACT
    budget: Budget = field(default_factory=Budget)
    reviewers: frozenset[str] = frozenset({"reviewer"})
    approval_ttl_s: float = 3600.0
    max_result_tokens: int = 2000  # a tool result over this becomes a handle plus a summary
    max_approval_requests: int = 3  # approval fatigue: fresh proposals after expiry or denial
    wait: WaitPolicy = field(default_factory=WaitPolicy)
    escalation: Escalation | None = None
    acceptance: Acceptance | None = None
    closing: ClosingReport | None = None  # None: no closing work; FINALIZING passes at once
    scratchpad: ScratchpadPolicy | None = None  # None: the state view alone, no past steps
    memory: MemoryPolicy | None = None  # None: no episodes (memory tools work if declared)


#: A scripted model's policy: (the view as data, the call's number) -> the reply.
PolicyFn = Callable[[dict[str, Any], int], Any]


@dataclass(frozen=True)
class AgentModule:
    """What a user's agent module declares: the profile, and how to build its tool backend
    and its scripted model's policy for a goal."""

    profile: AgentProfile
    make_backend: Callable[[], ToolBackend]
    make_policy: Callable[[str], PolicyFn]
