"""Seed 000's scenario table (A to H) through the example agent and the embedded runner."""

from __future__ import annotations

import pytest

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy, new_ids, same_call, search_loop
from kernel.budget import Budget
from kernel.states import LifecycleState, StopReason
from kernel.tools import OnUnknown
from tests.kernel.harness import go

S = LifecycleState
REFUND, EMAIL = ["refund", "ord_1001", 3000], ["email", "ord_1001"]

# name, run, stop, steps, tool calls, active seconds, effects (seed 000's table)
SCENARIOS = [
    ("A normal run", lambda: go(RefundPolicy()), StopReason.DONE, 5, 3, 10.0, [REFUND, EMAIL]),
    ("B same call repeated", lambda: go(same_call), StopReason.REPEATED_CALL, 3, 2, 5.3, []),
    ("C new ids every step", lambda: go(new_ids), StopReason.NO_PROGRESS, 3, 3, 5.7, []),
    (
        "D large results",
        lambda: go(search_loop, Budget(max_stalls=10, max_tool_calls=20, max_steps=20)),
        StopReason.MAX_TOKENS,
        4,
        4,
        9.2,
        [],
    ),
    (
        "E slow model calls",
        lambda: go(RefundPolicy(latency=6.0)),
        StopReason.DEADLINE,
        5,
        3,
        30.0,
        [REFUND, EMAIL],
    ),
    (
        "F step cap too low",
        lambda: go(RefundPolicy(), Budget(max_steps=3)),
        StopReason.MAX_STEPS,
        3,
        2,
        6.1,
        [REFUND],
    ),
    (
        "H write times out",
        lambda: go(RefundPolicy(), backend=SupportStoreBackend(latency={"issue_refund": 40.0})),
        StopReason.UNKNOWN_OUTCOME,
        3,
        2,
        30.0,
        [REFUND],
    ),
]


@pytest.mark.parametrize(
    ("name", "run", "stop", "steps", "tools", "secs", "effects"),
    SCENARIOS,
    ids=[s[0] for s in SCENARIOS],
)
def test_scenario_row(name, run, stop, steps, tools, secs, effects) -> None:  # type: ignore[no-untyped-def]
    r = run()
    rec = r.rec
    assert rec.stop_reason is stop
    assert rec.turn == steps
    assert rec.tool_dispatches == tools
    assert rec.active_s == pytest.approx(secs)
    assert r.effects() == effects
    assert rec.state in (S.COMPLETED, S.FAILED)
    assert rec.ledger.tokens.actual <= rec.budget.max_tokens


def test_d_stops_within_its_token_budget() -> None:
    r = go(search_loop, Budget(max_stalls=10, max_tool_calls=20, max_steps=20))
    assert r.rec.ledger.tokens.actual == 3584
    assert r.rec.ledger.tokens.actual + r.rec.ledger.tokens.reserved <= 4000


def test_g_is_held_before_any_effect_then_approved() -> None:
    r = go(RefundPolicy("ord_1004", 8000))
    rec = r.rec
    assert rec.state is S.AWAITING_APPROVAL and rec.stop_reason is None
    assert (rec.turn, rec.tool_dispatches, rec.active_s) == (3, 1, pytest.approx(4.9))
    assert r.effects() == []
    assert r.out.held is not None and r.out.held.args["amount_cents"] == 8000
    after = r.runner.approve(rec, r.out.held).record
    assert after.stop_reason is StopReason.DONE and after.state is S.COMPLETED
    assert (after.turn, after.tool_dispatches, after.active_s) == (5, 3, pytest.approx(10.0))
    assert r.effects() == [["refund", "ord_1004", 8000], ["email", "ord_1004"]]


@pytest.mark.parametrize("rule", [OnUnknown.RESEND, OnUnknown.LOOKUP])
def test_h_resolved_by_its_tool_rule_ends_done_with_one_refund(rule: OnUnknown) -> None:
    backend = SupportStoreBackend(latency={"issue_refund": 40.0})
    r = go(RefundPolicy(), Budget(deadline_s=120), backend=backend, on_unknown=rule)
    assert r.rec.stop_reason is StopReason.DONE
    assert r.effects() == [REFUND, EMAIL]
    assert r.rec.ledger.reservations == {}, "every reservation settled by evidence"


def test_h_default_hands_the_unknown_write_to_the_reconciler_which_never_refunds() -> None:
    r = go(RefundPolicy(), backend=SupportStoreBackend(latency={"issue_refund": 40.0}))
    assert r.rec.stop_reason is StopReason.UNKNOWN_OUTCOME
    refund = next(op for op in r.rec.operations.values() if op.tool == "issue_refund")
    assert refund.settlement_owner == "reconciler"
    # The tool has no lookup: the runner, as reconciler, writes it off. A timeout never
    # refunds: the reservation is charged in full and the effect stays unknown, on the chain.
    assert refund.evidence is not None and refund.evidence["effect"] == "unknown"
    assert r.rec.ledger.reservations == {} and r.rec.ledger.tool_calls.actual == 2
    (row,) = [x for x in r.out.rows if x.outcome == "written_off"]
    assert row.call_id == refund.call_id and row.detail["why"] == "no lookup"


def test_closing_messages_are_built_from_state() -> None:
    f = go(RefundPolicy(), Budget(max_steps=3)).rec.closing_message
    assert f == (
        "The run stopped at its step limit: your refund was issued; "
        "the confirmation email was not sent."
    )
    e = go(RefundPolicy(latency=6.0)).rec.closing_message
    assert e is not None and "your refund was issued" in e and "email was sent" in e
