"""Plans, the error taxonomy, malformed replies and the repeat and stall limits."""

from __future__ import annotations

from typing import Any

import pytest

from examples.support_store import make_agent
from examples.support_store.policies import Fn
from kernel.budget import Budget
from kernel.events import DispatchTool
from kernel.plan import validate_plan
from kernel.states import StopReason
from tests.kernel.harness import go

CATALOG = make_agent().profile.catalog


@pytest.mark.parametrize(
    ("steps", "problems"),
    [
        (
            [
                {"id": "s1", "tool": "get_order"},
                {"id": "s2", "tool": "issue_refund", "depends_on": ["s1"]},
            ],
            [],
        ),
        ([{"id": "s1", "tool": "delete_order"}], ["s1: unknown tool 'delete_order'"]),
        ([{"id": "s1", "tool": "issue_refund"}], ["s1: write step has no prerequisite"]),
        (
            [
                {"id": "s1", "tool": "get_order", "depends_on": ["s2"]},
                {"id": "s2", "tool": "get_order"},
            ],
            ["s1: depends on 's2', which is not an earlier step"],
        ),
        ([{"id": f"s{i}", "tool": "get_order"} for i in range(8)], ["too many steps (8 > 6)"]),
        ([], ["plan must be a non-empty list of steps"]),
        (
            [{"id": "s1", "tool": "get_order"}, {"id": "s1", "tool": "get_order"}],
            ["s1: duplicate id"],
        ),
    ],
)
def test_plan_validation_gives_one_precise_reason_per_problem(
    steps: Any, problems: list[str]
) -> None:
    assert validate_plan(steps, CATALOG, 6) == problems


def test_same_recoverable_error_n_times_in_a_row_becomes_fatal() -> None:
    # an unknown tool each time, with different arguments so neither the repeat limit
    # nor the stall limit (set high) fires first
    policy = Fn(lambda v, i: {"type": "tool", "name": "delete_order", "args": {"n": i}})
    r = go(policy, Budget(max_same_error=3, max_stalls=10, max_steps=10))
    assert r.rec.stop_reason is StopReason.FAILED
    assert r.rec.turn == 3
    assert r.rec.error_streak.kind == "unknown_tool" and r.rec.error_streak.count == 3


def test_different_recoverable_errors_do_not_add_up() -> None:
    kinds = ["delete_order", "get_order"]  # unknown_tool, then schema_violation (no order_id)

    def fn(v: dict[str, Any], i: int) -> dict[str, Any]:
        return {"type": "tool", "name": kinds[i % 2], "args": {"n": i}}

    r = go(Fn(fn), Budget(max_same_error=2, max_stalls=10, max_steps=6, max_tool_calls=6))
    assert r.rec.stop_reason is StopReason.MAX_STEPS


@pytest.mark.parametrize(
    "reply",
    [
        "{not json",
        '{"type": "dance"}',
        {"type": "tool"},
        {"type": "tool", "name": 7},
        {"type": "tool", "name": "get_order", "args": "ord_1001"},
        [1, 2],
        None,
    ],
)
def test_malformed_reply_is_an_observation_never_a_dispatch(reply: Any) -> None:
    r = go(Fn(lambda v, i: reply), Budget(max_steps=1))
    rec = r.rec
    assert rec.stop_reason is StopReason.MAX_STEPS
    assert rec.tool_dispatches == 0
    assert r.backend.calls == 0
    assert rec.last_observation is not None and rec.last_observation["status"] == "error"
    assert not any(isinstance(e, DispatchTool) for e in r.out.events)


def test_completed_with_open_steps_is_plan_incomplete() -> None:
    def fn(v: dict[str, Any], i: int) -> dict[str, Any]:
        if i == 1:
            return {"type": "plan", "steps": [{"id": "s1", "tool": "get_order"}]}
        return {"type": "final", "outcome": "completed", "text": "all done"}

    r = go(Fn(fn), Budget(max_steps=2))
    assert r.rec.last_observation == {
        "status": "error",
        "code": "plan_incomplete",
        "detail": ["s1"],
    }
    assert r.rec.stop_reason is StopReason.MAX_STEPS


def test_second_plan_refused_unless_replan_budget_allows() -> None:
    plan = {"type": "plan", "steps": [{"id": "s1", "tool": "get_order"}]}
    r = go(Fn(lambda v, i: plan), Budget(max_steps=2, max_stalls=5))
    assert r.rec.last_observation is not None
    assert r.rec.last_observation["detail"] == ["a plan is already set"]
    again = go(Fn(lambda v, i: plan), Budget(max_steps=2, max_stalls=5, max_replans=1))
    assert again.rec.plan_revision == 2
    assert again.rec.control_epoch == 1, "a plan revision advances the control epoch"


def test_a_write_key_comes_from_trajectory_plan_step_tool_and_arguments() -> None:
    from examples.support_store.policies import RefundPolicy

    r = go(RefundPolicy())
    keys = {op.tool: op.idempotency_key for op in r.rec.operations.values() if op.tool}
    assert keys["issue_refund"].startswith("t1:s2:issue_refund:")
    assert keys["send_status_email"].startswith("t1:s3:send_status_email:")
    other = go(RefundPolicy(amount=2000))  # the same steps, another amount: another effect
    refund = [
        op.idempotency_key for op in other.rec.operations.values() if op.tool == "issue_refund"
    ]
    assert refund != [keys["issue_refund"]] and refund[0].startswith("t1:s2:issue_refund:")


def test_a_large_result_becomes_a_handle_and_a_summary() -> None:
    from kernel.render import bound_result, estimate_tokens

    big = {"status": "ok", "code": "x", "count": 3, "text": "policy " * 2000}
    out = bound_result(big, "t1/t1", max_tokens=2000, estimator=estimate_tokens)
    assert out["handle"] == "t1/t1" and out["tokens"] > 2000
    assert out["summary"]["status"] == "ok" and out["summary"]["count"] == 3
    assert out["summary"]["text"] == {
        "omitted_tokens": estimate_tokens('"' + "policy " * 2000 + '"')
    }
    small = {"status": "ok", "text": "short"}
    assert bound_result(small, "h", 2000, estimate_tokens) is small


def test_the_seed_policy_text_stays_in_the_view_at_the_default_size() -> None:
    from examples.support_store.backend import POLICY_TEXT
    from kernel.render import bound_result, estimate_tokens

    result = {"status": "ok", "text": POLICY_TEXT}  # about 1,150 tokens
    assert (
        bound_result(result, "h", make_agent().profile.max_result_tokens, estimate_tokens) is result
    )
