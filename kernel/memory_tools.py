"""The memory tools an agent may declare, and the episode a finished run leaves behind.

``remember_fact`` is a write like any other: it is admitted, granted, held for approval when
its predicate says so, and frozen by a read-only grant. ``recall_facts`` is a read. Neither
takes an owner from the model: the runtime that carries them out fills the tenant, the user and
the agent in from the trajectory (``worker.memory_tools``). A write of the same key replaces
the fact, so a re-send under the same call key has one effect (``OnUnknown.RESEND``).

:func:`episode_of` is pure: the episode of an ended run, from its record alone.
Design: ``docs/adr/0140-memory-tiers.md``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernel.memory import MAX_TAG_CHARS, MAX_TAGS, MemoryItem, MemoryKind, Scope
from kernel.record import TrajectoryRecord
from kernel.tools import DeclaredTool, OnUnknown, ToolKind, tool

DAY_MS = 86_400_000


@dataclass(frozen=True)
class MemoryPolicy:
    """What an agent keeps across runs: whether its ended runs leave an episode, and whether
    episodes are filed under the user (else under the agent, for the whole tenant)."""

    episodes: bool = True
    episodes_per_user: bool = False
    recall_episodes: int = 0  # how many recalled episodes the first view shows


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


class RecallArgs(BaseModel):
    """The tags to recall facts by."""

    tags: list[str] = Field(min_length=1, max_length=8)
    limit: int = Field(5, ge=1, le=20)


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

_WORD = re.compile(r"[a-z0-9_]{3,}")


def goal_tags(goal: str) -> list[str]:
    """The tags an episode is filed and recalled under: the goal's distinct words."""
    words = [w[:MAX_TAG_CHARS] for w in _WORD.findall(goal.lower())]
    return sorted(set(words))[:MAX_TAGS]


def episode_of(
    rec: TrajectoryRecord, now_ms: int, per_user: bool, lesson: str | None = None
) -> MemoryItem:
    """The episode of an ended run: goal, stop reason, steps, cost and an optional lesson,
    under the user (``per_user``) or the agent of the trajectory's tenant."""
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
            "lesson": lesson,
        },
        tags=goal_tags(rec.goal) or ["untagged"],
        written_ms=now_ms,
    )
