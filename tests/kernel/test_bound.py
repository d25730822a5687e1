"""No run passes any bound, whatever the model does (seed 000, "What the limits guarantee")."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.amounts import Dimension
from kernel.states import TERMINAL, LifecycleState, StopReason
from tests.kernel.harness import Run, go
from tests.kernel.random_models import random_backend, random_budget, random_policy, random_rule

SUSPENDED = {LifecycleState.AWAITING_APPROVAL}


def one_run(seed: int) -> Run:
    rng = random.Random(seed)
    budget = random_budget(rng)
    return go(random_policy(rng), budget, backend=random_backend(rng), on_unknown=random_rule(rng))


def check_bounds(r: Run) -> None:
    rec, b = r.rec, r.rec.budget
    assert rec.state in TERMINAL or rec.state in SUSPENDED, rec.state
    if rec.state in TERMINAL:
        assert rec.stop_reason in set(StopReason)
    for dim in Dimension:
        acct = rec.ledger.account(dim)
        assert acct.actual + acct.reserved <= acct.allowance, (dim, acct)
    assert rec.turn <= b.max_steps
    assert rec.tool_dispatches <= b.max_tool_calls
    assert rec.ledger.tokens.actual <= b.max_tokens
    assert rec.active_s <= b.deadline_s + 1e-9
    for order in r.backend.state.orders().values():  # type: ignore[attr-defined]
        assert order["refunded"] <= order["total"]


def test_two_thousand_random_models_never_pass_a_bound() -> None:
    stops: Counter[str] = Counter()
    reached: set[str] = set()
    for seed in range(2000):
        r = one_run(seed)
        check_bounds(r)
        rec, b = r.rec, r.rec.budget
        stops[rec.stop_reason.value if rec.stop_reason else rec.state.value] += 1
        if rec.turn == b.max_steps:
            reached.add("steps")
        if rec.tool_dispatches == b.max_tool_calls:
            reached.add("tool_calls")
        if rec.stop_reason is StopReason.MAX_TOKENS:
            reached.add("tokens")
        if rec.stop_reason is StopReason.MAX_COST:
            reached.add("dollars")
        if rec.active_s == b.deadline_s:
            reached.add("deadline")
    expected = set(StopReason) - {StopReason.CANCELED, StopReason.KILLED, StopReason.WALL_CLOCK}
    seen = {StopReason(s) for s in stops if s in StopReason._value2member_map_}
    assert expected <= seen, f"never seen: {expected - seen}; stops: {dict(stops)}"
    assert stops[LifecycleState.AWAITING_APPROVAL.value] > 0, "some runs are suspended"
    assert reached == {"steps", "tool_calls", "tokens", "dollars", "deadline"}, reached


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=2000, max_value=2**32))
def test_random_models_never_pass_a_bound_hypothesis(seed: int) -> None:
    check_bounds(one_run(seed))
