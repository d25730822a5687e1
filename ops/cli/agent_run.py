"""One agent as the CLI runs it on the embedded runner: its model, its tool backend and, when
its profile keeps memory, the SQLite memory that outlives the run (``reins run``, and the
decisions and controls that carry a stored run on)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.agent import AgentModule, AgentProfile
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.tools import ToolBackend
from router.fleet.agents import load_agent
from router.fleet.episodes import write_episode
from router.fleet.memory_config import DAY_MS
from router.process.memory_sweep import sweep_once
from store.memory_sqlite import SqliteMemory
from worker.memory_tools import MemoryBackend, uses_memory
from worker.models import Model
from worker.providers import STREAMED, make_model, with_model
from worker.providers.embeddings import Embedder
from worker.providers.http import PoolOptions


@dataclass
class AgentRun:
    """What the embedded runner needs for one agent's run; :meth:`close` once it stops."""

    agent: AgentModule
    profile: AgentProfile
    model: Model
    backend: Any  # the agent's own backend (its effects, when it keeps them)
    tools: ToolBackend  # the backend the runner calls: the agent's, behind memory if it has it
    memory: SqliteMemory | None = None
    bind: Callable[[TrajectoryRecord], ToolBackend] | None = None

    @classmethod
    def build(
        cls,
        agent_ref: str,
        goal: str,
        tenant: str,
        *,
        provider: str | None = None,
        base_url: str | None = None,
        model_name: str | None = None,
        api_key_env: str | None = None,
        latency_header: str | None = None,
    ) -> AgentRun:
        """Load ``agent_ref`` and build its parts for a run on ``goal`` in ``tenant``; the
        model options override the profile's (a ``None`` keeps it)."""
        agent = load_agent(agent_ref)
        settings = Settings.from_env(os.environ)
        backend = agent.make_backend()
        tools: ToolBackend = backend
        memory, bind = None, None
        if uses_memory(agent.profile):  # facts and episodes outlive the run, in the SQLite file
            memory = SqliteMemory.from_settings(settings)
            tools = MemoryBackend(
                backend,
                memory,
                tenant,
                agent_ref,
                time.time,
                profile=agent.profile,
                embedder=Embedder.from_settings(settings, os.environ),
            )
            bind = tools.bound  # each write judged by the run's record (kernel.memory_policy)
        profile = with_model(
            agent.profile,
            provider=provider,
            base_url=base_url,
            name=model_name,
            api_key_env=api_key_env,
        )
        options: dict[str, Any] = {}
        if profile.model.provider in STREAMED:  # the route's pooled connections, as a worker's
            options["pool_options"] = PoolOptions.from_settings(settings)
        model = make_model(
            profile, agent.make_policy(goal), os.environ, latency_header=latency_header, **options
        )
        return cls(agent, profile, model, backend, tools, memory, bind)

    def context(self) -> KernelContext:
        """The kernel's context for this agent's profile."""
        return KernelContext(self.profile)

    def effects(self) -> list[Any]:
        """What the agent's backend did in this process, if it keeps a ledger of effects."""
        return list(self.backend.effects()) if hasattr(self.backend, "effects") else []

    def close(self, rec: TrajectoryRecord) -> None:
        """After the run stopped at ``rec``: its episode written and expired memory swept."""
        if self.memory is None:
            return
        write_episode(self.memory, rec, self.profile, time.time())
        days = Settings.from_env(os.environ).memory_retention_days
        sweep_once(self.memory, rec.tenant, int(days * DAY_MS), time.time())  # expiry deletes
        self.memory.close()
