"""Executed plans (ReWOO, plan-execute-replan): a step that needs approval is held for a
reviewer, not failed; plan-execute-replan re-plans on a result that breaks its declared schema
or range and on arguments that break the tool's schema once resolved, by default, within a
bound past which the run stops and says why."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic import BaseModel, Field

from examples.support_store import get_order, make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RewooRefund
from kernel.agent import AgentModule, LoopShape
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.context import KernelContext
from kernel.record import ApprovalStatus
from kernel.states import LifecycleState, StopReason
from kernel.tools import Catalog
from tests.kernel.harness import new_record
from worker.embedded import EmbeddedRunner, RunResult
from worker.models import ScriptedModel

S = LifecycleState
BIG = "refund the damaged item on order ord_1004"  # 15,000 cents: over the automatic limit


class OrderRead(BaseModel):
    """What the planner assumes of an order read: a total within the store's range."""

    status: str
    total_cents: int = Field(ge=0, le=10_000)


def ranged(agent: AgentModule) -> AgentModule:
    """The agent with ``get_order`` declaring its result's schema and range."""
    spec = replace(get_order.spec, result_model=OrderRead)
    tools = {**agent.profile.catalog.tools, spec.name: spec}
    profile = replace(agent.profile, catalog=Catalog(tools))
    return replace(agent, profile=profile)


def plan(order: str, refund_cents: Any = 3000) -> dict[str, Any]:
    return {
        "type": "plan",
        "steps": [
            {"id": "E1", "tool": "get_order", "args": {"order_id": order}},
            {
                "id": "E2",
                "tool": "issue_refund",
                "depends_on": ["E1"],
                "args": {"order_id": order, "amount_cents": refund_cents, "reason": "damaged"},
            },
        ],
    }


class Planner:
    """Plans ``first``, then ``again`` whenever the kernel re-enters it; answers when done."""

    def __init__(self, first: dict[str, Any], again: dict[str, Any]) -> None:
        self.first, self.again, self.causes = first, again, []

    def __call__(self, view: dict[str, Any], i: int) -> dict[str, Any]:
        last = view.get("last_result") or {}
        if not view["plan"]:
            return self.first
        if last.get("code") == "replan":
            self.causes.append(last["cause"])
            return self.again
        return {"type": "final", "outcome": "completed", "text": "done"}


def go(
    agent: AgentModule, policy: Any, budget: Budget | None = None, goal: str = BIG
) -> tuple[RunResult, SupportStoreBackend, EmbeddedRunner]:
    budget = budget or agent.profile.budget
    backend = SupportStoreBackend()
    runner = EmbeddedRunner(KernelContext(agent.profile), ScriptedModel(policy), backend)
    return runner.run(new_record(budget, goal=goal)), backend, runner


def test_a_rewoo_step_that_needs_approval_is_held_and_runs_once_approved() -> None:
    agent = make_agent(loop=LoopShape.REWOO, policy=RewooRefund.from_goal)
    out, backend, runner = go(agent, RewooRefund.from_goal(BIG))
    rec = out.record
    assert rec.state is S.AWAITING_APPROVAL, "held for a reviewer, not failed"
    held = rec.held
    assert held is not None and held.plan_step == "E2" and held.args["amount_cents"] == 15000
    assert backend.effects() == [], "nothing sent before the decision"
    assert all(s.status.value != "failed" for s in rec.plan)
    done = runner.approve(rec, held).record
    assert done.state is S.COMPLETED and done.held is not None
    assert done.held.status is ApprovalStatus.APPROVED
    assert backend.effects() == [["refund", "ord_1004", 15000], ["email", "ord_1004"]]


def test_a_result_outside_its_declared_range_re_plans_and_is_never_staged() -> None:
    agent = ranged(make_agent(loop=LoopShape.PLAN_EXECUTE))
    planner = Planner(plan("ord_1004"), plan("ord_1001"))
    out, backend, _ = go(agent, planner)
    rec = out.record
    assert rec.stop_reason is StopReason.DONE and rec.plan_revision == 2
    (cause,) = planner.causes
    assert cause["code"] == "result_invalid" and cause["step"] == "E1"
    assert "total_cents" in cause["detail"]
    assert "ord_1004.total_cents" not in rec.facts, "a broken result builds no fact"
    assert backend.effects() == [["refund", "ord_1001", 3000]], "only the re-planned refund"


def test_a_result_within_its_range_does_not_re_plan() -> None:
    agent = ranged(make_agent(loop=LoopShape.PLAN_EXECUTE))
    planner = Planner(plan("ord_1001"), plan("ord_1001"))
    out, backend, _ = go(agent, planner, goal="refund ord_1001")
    assert out.record.plan_revision == 1 and planner.causes == []
    assert backend.effects() == [["refund", "ord_1001", 3000]]


def test_an_argument_that_fails_validation_after_resolution_re_plans() -> None:
    agent = make_agent(loop=LoopShape.PLAN_EXECUTE)
    # ``#E1.order_status`` resolves to "delivered": not a number of cents.
    planner = Planner(plan("ord_1001", "#E1.order_status"), plan("ord_1001"))
    out, backend, _ = go(agent, planner, goal="refund ord_1001")
    rec = out.record
    (cause,) = planner.causes
    assert cause["code"] == "schema_violation" and cause["step"] == "E2"
    assert "amount_cents" in cause["detail"]
    assert rec.stop_reason is StopReason.DONE and rec.plan_revision == 2
    assert backend.effects() == [["refund", "ord_1001", 3000]]


def test_by_default_plan_execute_re_plans_up_to_its_bound_then_stops_saying_why() -> None:
    agent = make_agent(loop=LoopShape.PLAN_EXECUTE)  # Budget(): no max_replans named
    assert agent.profile.budget.max_replans is None
    planner = Planner(plan("ord_9999"), plan("ord_9999"))  # not_found, every time
    out, backend, _ = go(agent, planner)
    rec = out.record
    assert rec.plan_revision == 3, "the first plan and the two re-plans of the default bound"
    assert len(planner.causes) == 2
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.FAILED
    stop = out.rows[-1]
    assert stop.kind is RowKind.STOP and stop.error is not None
    assert "no re-plan is left (max_replans 2)" in stop.error and "not_found" in stop.error
    assert backend.effects() == []


def test_a_named_bound_overrides_the_default() -> None:
    agent = make_agent(loop=LoopShape.PLAN_EXECUTE)
    planner = Planner(plan("ord_9999"), plan("ord_9999"))
    out, _, _ = go(agent, planner, Budget(max_replans=1))
    assert out.record.plan_revision == 2 and len(planner.causes) == 1
    assert "(max_replans 1)" in (out.rows[-1].error or "")
