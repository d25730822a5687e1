"""``reins demo``: a newcomer's minute with reins, on the embedded default.

Two tenants, a handful of refund requests against the support-store agent. Each row shows a
different decision reins made outside the model: a run that completes, a refund held for a
person and then approved, a budget that stops a run and says what was done, a write whose
outcome is unknown and is never retried blindly, and a loop stopped for making no progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy, new_ids
from kernel.agent import PolicyFn
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.tools import OnUnknown
from ops.cli.report import summary, table
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel


@dataclass(frozen=True)
class Case:
    """One demo trajectory."""

    tenant: str
    name: str
    goal: str
    policy: PolicyFn
    budget: Budget = field(default_factory=Budget)
    slow_refund: bool = False
    on_unknown: OnUnknown = OnUnknown.STOP
    approve: bool = False
    lesson: str = ""


CASES = [
    Case(
        "acme",
        "refund",
        "refund the damaged item on order ord_1001",
        RefundPolicy.from_goal("ord_1001"),
        lesson="plan, read, refund, e-mail, done: every step admitted against the budget",
    ),
    Case(
        "acme",
        "big-refund",
        "refund 8000 cents on order ord_1004",
        RefundPolicy.from_goal("refund 8000 cents on ord_1004"),
        approve=True,
        lesson="over the automatic limit: held for a reviewer, approved, then dispatched",
    ),
    Case(
        "acme",
        "tight-budget",
        "refund the damaged item on order ord_1001",
        RefundPolicy.from_goal("ord_1001"),
        budget=Budget(max_steps=3),
        lesson="the step budget ends the run; the message says the e-mail was not sent",
    ),
    Case(
        "globex",
        "slow-refund",
        "refund the damaged item on order ord_1001",
        RefundPolicy.from_goal("ord_1001"),
        slow_refund=True,
        lesson="the refund timed out: outcome unknown, so reins stops instead of retrying",
    ),
    Case(
        "globex",
        "slow-refund-lookup",
        "refund the damaged item on order ord_1001",
        RefundPolicy.from_goal("ord_1001"),
        budget=Budget(deadline_s=120),
        slow_refund=True,
        on_unknown=OnUnknown.LOOKUP,
        lesson="same timeout, but the tool declares 'lookup': reins asks, finds it, finishes",
    ),
    Case(
        "globex",
        "looping-model",
        "refund the damaged item on order ord_1001",
        new_ids,
        lesson="a model that varies its calls without progress is stopped by the stall limit",
    ),
]


def run_case(i: int, case: Case) -> tuple[dict[str, Any], str]:
    """Run one case on its own backend; approve a held refund when the case says so."""
    agent = make_agent(on_unknown=case.on_unknown, budget=case.budget)
    backend = SupportStoreBackend(latency={"issue_refund": 40.0} if case.slow_refund else None)
    runner = EmbeddedRunner(KernelContext(agent.profile), ScriptedModel(case.policy), backend)
    rec = TrajectoryRecord.create(
        trajectory_id=f"{case.tenant}/{case.name}",
        tenant=case.tenant,
        user="cu_ana",
        goal=case.goal,
        agent="examples.support_store:agent",
        budget=case.budget,
        now=0.0,
    )
    out = runner.run(rec)
    if out.held is not None and case.approve:
        out = runner.approve(out.record, out.held, reviewer="reviewer")
    return summary(out.record, backend.effects()), case.lesson


def demo_cmd() -> None:
    """Run a handful of trajectories for two tenants and show how each one ended."""
    console = Console()
    console.width = max(console.width, 132)  # the table reads best whole
    console.print(
        "[bold]reins demo[/]: the model proposes; reins decides. "
        "Support-store refunds for two tenants, on the embedded runner.\n"
    )
    rows, lessons = [], []
    for i, case in enumerate(CASES, 1):
        row, lesson = run_case(i, case)
        rows.append(row)
        lessons.append((row, lesson))
    console.print(table(rows, "how each trajectory ended"))
    for row, lesson in lessons:
        console.print(f"[cyan]{row['trajectory_id']}[/]: {lesson}")
        console.print(f"    [dim]closing message:[/] {row['closing_message']}")
    console.print(
        '\nNext: [bold]reins run examples.support_store:agent --goal "refund the '
        'damaged item on order ord_1001" --json[/]'
    )
