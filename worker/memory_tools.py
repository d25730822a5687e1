"""Carrying out the memory tools, and writing the episode of a run a turn ended.

The owner of every fact written or recalled comes from the trajectory's record (its tenant,
user and agent), never from the arguments the model wrote; the arguments were validated by the
kernel against the tool's schema before the command existed. Writing an episode is best
effort: a memory store that does not answer costs the episode, never the turn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kernel.agent import AgentProfile
from kernel.errors import ReinsError
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, ms
from kernel.memory_tools import DAY_MS, MEMORY_TOOL_NAMES, RecallArgs, RememberArgs, episode_of
from kernel.record import TrajectoryRecord
from kernel.tools import ToolBackend
from store.memory_base import MemoryBank

log = logging.getLogger("reins.worker.memory")


def uses_memory(profile: AgentProfile) -> bool:
    """True when the agent declares a memory tool or keeps episodes."""
    return profile.memory is not None or any(n in profile.catalog for n in MEMORY_TOOL_NAMES)


class MemoryBackend:
    """An agent's tool backend with the memory tools of one trajectory's owners in front:
    ``remember_fact`` and ``recall_facts`` go to ``bank`` under ``tenant``, the calling user and
    ``agent``; every other call and lookup goes to ``inner`` as it was."""

    def __init__(
        self,
        inner: ToolBackend,
        bank: MemoryBank,
        tenant: str,
        agent: str,
        clock: Callable[[], float],
        on_recall: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.inner, self.bank, self.clock = inner, bank, clock
        self.tenant, self.agent = tenant, agent
        self.on_recall = on_recall  # told (tenant, hit) after each recall

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        """A memory tool against the bank; any other tool through the inner backend."""
        if tool not in MEMORY_TOOL_NAMES:
            return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)
        owners = Visibility(self.tenant, user, self.agent)
        result, secs = call(self.bank, owners, tool, args, self.clock())
        if self.on_recall is not None and result.get("code") == "recalled":
            self.on_recall(self.tenant, bool(result["facts"]))
        return result, secs

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        """The inner backend's lookup (memory tools are re-sent, never looked up)."""
        return self.inner.lookup(tool, key, fence=fence)


def call(
    bank: MemoryBank, owners: Visibility, tool: str, raw: dict[str, Any], now_s: float
) -> tuple[dict[str, Any], float]:
    """Carry out ``remember_fact`` or ``recall_facts`` for the caller ``owners``."""
    now = ms(now_s)
    if tool == "remember_fact":
        args = RememberArgs.model_validate(raw)
        owner = owners.owner(Scope(args.scope))
        bank.put(
            MemoryItem(
                kind=MemoryKind.FACT,
                tenant=owner.tenant,
                scope=owner.scope,
                subject=owner.subject,
                key=args.key,
                value={"text": args.value},
                tags=args.tags,
                written_ms=now,
                expires_ms=now + args.ttl_days * DAY_MS,
            )
        )
        return {"status": "ok", "code": "remembered", "key": args.key}, 0.0
    wanted = RecallArgs.model_validate(raw)
    found = bank.recall(owners, MemoryKind.FACT, wanted.tags, now, wanted.limit)
    facts = [{"key": i.key, "value": i.value.get("text"), "scope": i.scope.value} for i in found]
    return {"status": "ok", "code": "recalled", "facts": facts}, 0.0


def write_episode(bank: MemoryBank, rec: TrajectoryRecord, now_s: float, per_user: bool) -> bool:
    """Write the episode of the ended run ``rec``; False (logged) if the store refused."""
    try:
        bank.put(episode_of(rec, ms(now_s), per_user))
    except ReinsError as exc:
        log.warning("%s: episode not written: %s", rec.trajectory_id, exc)
        return False
    return True
