"""Carrying out the memory tools, and writing the episode of a run a turn ended.

The owner of every fact written or recalled comes from the trajectory's record (its tenant,
user and agent), never from the arguments the model wrote; the arguments were validated by the
kernel against the tool's schema before the command existed. Writing an episode is best
effort: a memory store that does not answer costs the episode, never the turn.
"""

from __future__ import annotations

import logging
from typing import Any

from kernel.errors import ReinsError
from kernel.events import DispatchTool, LookupEffect
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, ms
from kernel.memory_tools import DAY_MS, MEMORY_TOOL_NAMES, RecallArgs, RememberArgs, episode_of
from kernel.record import TrajectoryRecord
from kernel.tools import ToolBackend
from store.memory_base import MemoryBank
from worker.backend import dispatch

log = logging.getLogger("reins.worker.memory")


def carry_out(
    backend: ToolBackend,
    memory: MemoryBank | None,
    rec: TrajectoryRecord,
    cmd: DispatchTool | LookupEffect,
    now_s: float,
) -> tuple[dict[str, Any], float]:
    """One tool command: a memory tool against ``memory`` (when there is one), any other
    through the agent's ``backend``."""
    if memory is not None and isinstance(cmd, DispatchTool) and cmd.tool in MEMORY_TOOL_NAMES:
        return call(memory, rec, cmd, now_s)
    return dispatch(backend, rec.user, cmd)


def call(
    bank: MemoryBank, rec: TrajectoryRecord, cmd: DispatchTool, now_s: float
) -> tuple[dict[str, Any], float]:
    """Carry out ``remember_fact`` or ``recall_facts`` for ``rec``; (result, seconds)."""
    now = ms(now_s)
    if cmd.tool == "remember_fact":
        args = RememberArgs.model_validate(cmd.args)
        scope = Scope(args.scope)
        subject = {Scope.USER: rec.user, Scope.TENANT: "", Scope.AGENT: rec.agent}[scope]
        bank.put(
            MemoryItem(
                kind=MemoryKind.FACT,
                tenant=rec.tenant,
                scope=scope,
                subject=subject,
                key=args.key,
                value={"text": args.value},
                tags=args.tags,
                written_ms=now,
                expires_ms=now + args.ttl_days * DAY_MS,
            )
        )
        return {"status": "ok", "code": "remembered", "key": args.key}, 0.0
    wanted = RecallArgs.model_validate(cmd.args)
    caller = Visibility(rec.tenant, rec.user, rec.agent)
    found = bank.recall(caller, MemoryKind.FACT, wanted.tags, now, wanted.limit)
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
