"""Helpers that run the support-store agent on the embedded runner, as the seeds' `go`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from kernel.agent import PolicyFn
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.tools import OnUnknown
from worker.embedded import EmbeddedRunner, RunResult
from worker.models import ScriptedModel

GOAL = "refund the damaged item on order ord_1001"


@dataclass
class Run:
    """A finished (or suspended) run with everything a test inspects."""

    out: RunResult
    backend: SupportStoreBackend
    runner: EmbeddedRunner

    @property
    def rec(self) -> TrajectoryRecord:
        return self.out.record

    def effects(self) -> list[list[Any]]:
        return self.backend.effects()


def new_record(budget: Budget, goal: str = GOAL, tid: str = "t1") -> TrajectoryRecord:
    return TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="acme",
        user="cu_ana",
        goal=goal,
        agent="examples.support_store:agent",
        budget=budget,
        now=0.0,
    )


def go(
    policy: PolicyFn,
    budget: Budget | None = None,
    backend: SupportStoreBackend | None = None,
    on_unknown: OnUnknown = OnUnknown.STOP,
    goal: str = GOAL,
    usage_factor: float = 1.0,
) -> Run:
    budget = budget or Budget()
    agent = make_agent(on_unknown=on_unknown, budget=budget)
    backend = backend or SupportStoreBackend()
    model = ScriptedModel(policy, usage_factor=usage_factor)
    runner = EmbeddedRunner(KernelContext(agent.profile), model, backend)
    return Run(runner.run(new_record(budget, goal)), backend, runner)
