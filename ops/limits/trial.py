"""``reins limits trial``: an agent run over a task set under each candidate cap, as a policy.

Post-hoc truncation of a generous run only locates a candidate (seed 004 section 10.9.5): a
policy that steers, restricts or finalizes near its cap changes what happens below it. So each
candidate budget runs every task for real on the embedded runner, with the model, the tools and
the acceptance check held constant, and the same figures as ``reins limits report`` come from
those runs, beside what the seed says an evaluation must also report: unresolved liabilities,
approvals asked (operator interventions) and wall-clock time.

A task file is JSON lines: ``{"goal": "..."}`` and optionally ``"user"``, ``"approve"`` (the
reviewer's answer when the run asks for an approval; default true) and ``"backend"`` (keyword
arguments for the agent's ``make_backend``: the task's environment, for example a slow refund
service for the support store, ``{"latency": {"issue_refund": 40}}``).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernel.agent import AgentModule
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.errors import InvalidInput
from kernel.record import TrajectoryRecord
from ops.limits.sources import json_lines, outcome_of_record
from ops.limits.stats import CapFigures, Dim, RunOutcome, dimension_report, mark_ties
from worker.embedded import EmbeddedRunner
from worker.providers import make_model

#: The budget key each dimension's cap sets.
BUDGET_KEYS = {
    Dim.STEPS: "max_steps",
    Dim.TOOL_CALLS: "max_tool_calls",
    Dim.TOKENS: "max_tokens",
    Dim.DOLLARS: "max_cost",
    Dim.ACTIVE_S: "deadline_s",
}
#: A run that keeps asking for approvals is answered at most this many times.
MAX_DECISIONS = 5


@dataclass(frozen=True)
class Task:
    """One line of a task file."""

    goal: str
    user: str = "cu_ana"
    approve: bool = True
    backend: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RunFigures:
    """One task under one candidate."""

    outcome: RunOutcome
    stop_reason: str
    approvals: int
    unresolved_dollars: float
    open_operations: int
    wall_clock_s: float


@dataclass
class CandidateFigures:
    """Every task under one candidate cap, and the figures the report shows for it."""

    dim: Dim
    cap: float
    runs: list[RunFigures]

    def dollars(self, target_rse: float | None) -> CapFigures:
        """Cost per accepted task of the runs as they happened (the cap already bound them,
        so a cap above every run leaves the figures as they are), under this candidate's cap."""
        outcomes = [r.outcome for r in self.runs]
        figures = dimension_report(outcomes, Dim.DOLLARS, [math.inf], target_rse).caps[0]
        return replace(figures, cap=self.cap)

    def summary(self, dollars: CapFigures) -> dict[str, Any]:
        n = len(self.runs)
        walls = sorted(r.wall_clock_s for r in self.runs)
        return {
            "dimension": self.dim.value,
            "cap": self.cap,
            "tasks": n,
            "accepted": dollars.accepted,
            "acceptance": round(dollars.accepted / n, 6) if n else None,
            "total_dollars": round(dollars.total, 6),
            "cost_per_accepted": _r(dollars.cost_per_accepted),
            "rse": _r(dollars.rse),
            "tasks_for_target_rse": dollars.tasks_for_target_rse,
            "tie_with_best": dollars.tie_with_best,
            "unresolved_runs": sum(1 for r in self.runs if r.open_operations),
            "unresolved_dollars": round(sum(r.unresolved_dollars for r in self.runs), 6),
            "approvals_asked": sum(r.approvals for r in self.runs),
            "wall_clock_s_mean": round(sum(walls) / n, 3) if n else None,
            "wall_clock_s_max": walls[-1] if walls else None,
            "stop_reasons": dict(sorted(Counter(r.stop_reason for r in self.runs).items())),
        }


def summaries(
    figures: Sequence[CandidateFigures], target_rse: float | None
) -> list[dict[str, Any]]:
    """One row per candidate; within a dimension, the caps whose cost per accepted task is
    within the error of the lowest are marked as ties (``ops.limits.stats.mark_ties``)."""
    rows = []
    for dim in dict.fromkeys(f.dim for f in figures):
        group = [f for f in figures if f.dim is dim]
        priced = mark_ties([f.dollars(target_rse) for f in group])
        rows += [f.summary(d) for f, d in zip(group, priced, strict=True)]
    return rows


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def read_tasks(path: Path) -> list[Task]:
    """The task file; a bad line raises :class:`InvalidInput` naming it."""
    if not path.is_file():
        raise InvalidInput(f"{path}: no such task file")
    tasks = []
    for n, row in json_lines(path, path.read_text(encoding="utf-8")):
        if not isinstance(row.get("goal"), str) or not row["goal"]:
            raise InvalidInput(f"{path}:{n}: each line needs a non-empty string 'goal'")
        unknown = set(row) - {"goal", "user", "approve", "backend"}
        if unknown:
            raise InvalidInput(f"{path}:{n}: unknown keys {sorted(unknown)}")
        backend = row.get("backend", {})
        if not isinstance(backend, dict):
            raise InvalidInput(f"{path}:{n}: 'backend' must be an object of keyword arguments")
        tasks.append(
            Task(
                goal=row["goal"],
                user=str(row.get("user", "cu_ana")),
                approve=bool(row.get("approve", True)),
                backend=backend,
            )
        )
    if not tasks:
        raise InvalidInput(f"{path}: no tasks")
    return tasks


def candidate_budget(base: Budget, dim: Dim, cap: float) -> Budget:
    """The agent's budget with one dimension capped."""
    value = f"{cap:g}" if dim is Dim.DOLLARS else str(int(cap) if dim != Dim.ACTIVE_S else cap)
    return base.with_overrides([f"{BUDGET_KEYS[dim]}={value}"])


def run_task(
    agent: AgentModule, agent_ref: str, budget: Budget, task: Task, tid: str
) -> RunFigures:
    """One task on the embedded runner; held approvals answered as the task says."""
    profile = agent.profile
    try:
        backend = agent.make_backend(**task.backend)
    except TypeError as exc:
        refused = f"task {tid}: the agent's backend refused {task.backend}: {exc}"
        raise InvalidInput(refused) from None
    model = make_model(profile, agent.make_policy(task.goal), os.environ)
    runner = EmbeddedRunner(KernelContext(profile), model, backend)
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="trial",
        user=task.user,
        goal=task.goal,
        agent=agent_ref,
        budget=budget,
        now=0.0,
    )
    out = runner.run(rec)
    approvals, reviewer = 0, min(profile.reviewers, default="reviewer")  # one the agent accepts
    while out.held is not None and approvals < MAX_DECISIONS:
        approvals += 1
        out = runner.approve(out.record, out.held, reviewer=reviewer, approve=task.approve)
    final = out.record
    return RunFigures(
        outcome=outcome_of_record(final),
        stop_reason=final.stop_reason.value if final.stop_reason else final.state.value,
        approvals=approvals,
        unresolved_dollars=float(final.ledger.outstanding().dollars),
        open_operations=len(final.open_operations),
        wall_clock_s=runner.clock.now(),
    )


def trial(
    agent: AgentModule,
    agent_ref: str,
    tasks: Sequence[Task],
    caps: Mapping[Dim, Sequence[float]],
    base: Budget | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[CandidateFigures]:
    """Every task under every candidate cap; ``progress(done, total)`` after each run."""
    if not caps:
        raise InvalidInput("name the candidate caps: --caps steps=4,6,8")
    base = base or agent.profile.budget
    candidates = [(d, c, candidate_budget(base, d, c)) for d in caps for c in sorted(set(caps[d]))]
    total, done = len(candidates) * len(tasks), 0
    figures = []
    for dim, cap, budget in candidates:
        runs = []
        for i, task in enumerate(tasks):
            runs.append(run_task(agent, agent_ref, budget, task, f"trial-{dim}-{cap:g}-{i}"))
            done += 1
            if progress is not None:
                progress(done, total)
        figures.append(CandidateFigures(dim, cap, runs))
    return figures
