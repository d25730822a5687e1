"""The memory tools an agent may declare, and the episode a finished run leaves behind.

``remember_fact`` is a write like any other: it is admitted, granted, held for approval when
its predicate says so, and frozen by a read-only grant. ``recall_facts`` is a read. Neither
takes an owner from the model: the runtime that carries them out fills the tenant, the user and
the agent in from the trajectory (``worker.memory_tools``), and judges each write by the
agent's :class:`~kernel.memory_policy.MemoryPolicy` and the fact's provenance. A write of the
same key replaces the fact, so a re-send under the same call key has one effect
(``OnUnknown.RESEND``).

:func:`episode_of` is pure: the episode of an ended run, from its record alone.
Design: ``docs/adr/0140-memory-tiers.md``, ``docs/adr/0142-memory-governance.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernel.memory import MAX_TAG_CHARS, MAX_TAGS, MemoryItem, MemoryKind, Scope
from kernel.memory_policy import RECALL_TOOL, REMEMBER_TOOL, MemoryPolicy
from kernel.record import TrajectoryRecord
from kernel.tools import DeclaredTool, OnUnknown, ToolKind, tool

__all__ = ["MemoryPolicy", "RecallArgs", "RememberArgs", "episode_of", "remember_fact"]

DAY_MS = 86_400_000


def episode_view(item: MemoryItem) -> dict[str, Any]:
    """An earlier run's episode as a later run's first view shows it."""
    return {"written_ms": item.written_ms, **item.value}


class RememberArgs(BaseModel):
    """A durable fact: its key, its text, its tags, whose it is and for how long."""

    key: str = Field(min_length=1, max_length=200)
    value: str = Field(min_length=1, max_length=2000)
    tags: list[str] = Field(min_length=1, max_length=8)
    scope: Literal["user", "tenant", "agent"] = "user"
    ttl_days: int = Field(365, ge=1, le=3650)
    source: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="where the fact comes from: 'goal', or the call id of a tool result",
    )


class RecallArgs(BaseModel):
    """The tags to recall facts by, and optionally what they should be about in words (used
    where facts are ranked by embeddings, ``kernel.memory_rank``)."""

    tags: list[str] = Field(min_length=1, max_length=8)
    limit: int = Field(5, ge=1, le=20)
    query: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="what the facts should be about, in your own words (optional)",
    )


@tool(
    RememberArgs,
    kind=ToolKind.WRITE,
    on_unknown=OnUnknown.RESEND,
    deduplicates=True,
    liability=Decimal(0),
    done_text="I noted that for next time",
    not_done_text="I could not note that for next time",
)
def remember_fact(key: str, value: str, tags: list[str]) -> None:
    """Remember a durable fact about the user (or the tenant, or this agent) for later runs."""


@tool(RecallArgs)
def recall_facts(tags: list[str]) -> None:
    """Recall durable facts this run may see, best match first."""


MEMORY_TOOLS: tuple[DeclaredTool, ...] = (remember_fact, recall_facts)
MEMORY_TOOL_NAMES = frozenset(t.spec.name for t in MEMORY_TOOLS)
assert {REMEMBER_TOOL, RECALL_TOOL} == MEMORY_TOOL_NAMES  # kernel.memory_policy names them

_WORD = re.compile(r"[a-z0-9_]{3,}")


def goal_tags(goal: str) -> list[str]:
    """The tags an episode is filed and recalled under: the goal's distinct words."""
    words = [w[:MAX_TAG_CHARS] for w in _WORD.findall(goal.lower())]
    return sorted(set(words))[:MAX_TAGS]


def episode_of(
    rec: TrajectoryRecord,
    now_ms: int,
    per_user: bool,
    concerns: Iterable[str] = (),
) -> MemoryItem:
    """The episode of an ended run: goal, stop reason, steps, cost and its lesson (the closing
    message, built from the state), under the user (``per_user``) or the agent of the
    trajectory's tenant; it concerns the run's user and ``concerns``."""
    led = rec.ledger
    return MemoryItem(
        kind=MemoryKind.EPISODE,
        tenant=rec.tenant,
        scope=Scope.USER if per_user else Scope.AGENT,
        subject=rec.user if per_user else rec.agent,
        key=rec.trajectory_id,
        value={
            "goal": rec.goal,
            "outcome": rec.stop_reason.value if rec.stop_reason else None,
            "steps": rec.turn,
            "cost": str(led.dollars.actual),
            "lesson": rec.closing_message,
        },
        tags=goal_tags(rec.goal) or ["untagged"],
        written_ms=now_ms,
        concerns=[rec.user, *concerns],
        trajectory_id=rec.trajectory_id,
    )
