"""An agent profile: the model it calls, its prices, its tools, its loop shape, its budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from kernel.amounts import ModelPrice
from kernel.budget import Budget
from kernel.tools import Catalog


class LoopShape(StrEnum):
    """How the agent interleaves planning and acting (seed 001 section 2)."""

    REACT = "react"
    REWOO = "rewoo"
    PLAN_EXECUTE = "plan_execute"


@dataclass(frozen=True)
class ModelRef:
    """Which model to call and what it costs."""

    provider: str  # "scripted", "openai-compatible", ...
    name: str
    price: ModelPrice
    base_url: str | None = None
    api_key_env: str | None = None


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
