"""ReWOO and plan-execute-replan: pluggable loop shapes over the same kernel."""

from __future__ import annotations

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import ReplanningRefund, RewooRefund
from kernel.agent import LoopShape
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.context import KernelContext
from kernel.states import StopReason
from tests.kernel.harness import new_record
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel


def run(policy, loop: LoopShape, budget: Budget):  # type: ignore[no-untyped-def]
    agent = make_agent(loop=loop, budget=budget)
    backend = SupportStoreBackend()
    model = ScriptedModel(policy)
    out = EmbeddedRunner(KernelContext(agent.profile), model, backend).run(new_record(budget))
    return out, model, backend


def test_rewoo_makes_exactly_two_model_calls_and_resolves_references() -> None:
    out, model, backend = run(RewooRefund(), LoopShape.REWOO, Budget())
    rec = out.record
    assert rec.stop_reason is StopReason.DONE
    assert model.calls == 2 and rec.turn == 2
    assert backend.effects() == [["refund", "ord_1001", 4200], ["email", "ord_1001"]]
    refund = next(r for r in out.rows if r.kind is RowKind.TOOL and r.tool == "issue_refund")
    assert refund.args == {"order_id": "ord_1001", "amount_cents": 4200, "reason": "damaged"}


def test_rewoo_refuses_a_reference_to_a_later_step() -> None:
    def bad(view, i):  # type: ignore[no-untyped-def]
        return {
            "type": "plan",
            "steps": [
                {"id": "E1", "tool": "get_order", "args": {"order_id": "#E2.total_cents"}},
                {"id": "E2", "tool": "get_order", "args": {"order_id": "ord_1001"}},
            ],
        }

    out, _model, backend = run(bad, LoopShape.REWOO, Budget(max_steps=1))
    assert backend.calls == 0
    assert out.record.last_observation == {
        "status": "error",
        "code": "invalid_plan",
        "detail": ["E1: refers to #E2, which is not an earlier step"],
    }


def test_plan_execute_replans_exactly_once_on_not_found() -> None:
    out, model, backend = run(ReplanningRefund(), LoopShape.PLAN_EXECUTE, Budget(max_replans=1))
    rec = out.record
    assert rec.stop_reason is StopReason.DONE
    assert rec.plan_revision == 2, "one plan, one replan"
    assert model.calls == 3, "plan, replan, answer"
    assert backend.effects() == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
    reads = [r.args for r in out.rows if r.kind is RowKind.TOOL and r.tool == "get_order"]
    assert reads == [{"order_id": "ord_9999"}, {"order_id": "ord_1001"}]


def test_plan_execute_without_replan_budget_cannot_replan() -> None:
    budget = Budget(max_steps=3, max_replans=0)
    out, _model, backend = run(ReplanningRefund(), LoopShape.PLAN_EXECUTE, budget)
    assert out.record.plan_revision == 1
    assert backend.effects() == []
    assert out.record.stop_reason is StopReason.FAILED, "a broken plan with no re-plan left"
