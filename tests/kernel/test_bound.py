"""No run passes any bound, whatever the model does (seed 000, "What the limits guarantee")."""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.amounts import Amounts, Dimension
from kernel.budget import Budget
from kernel.chain import RowKind
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


# --- a provider that misreports its usage -----------------------------------------------------


def model_overruns(r: Run) -> list[dict[str, int | Decimal]]:
    """Each model call's usage past its reservation, as the kernel wrote it in the chain."""
    out = []
    for row in r.out.rows:
        if row.kind is RowKind.MODEL:
            over = (row.detail or {}).get("overrun") or {}
            out.append({k: Decimal(str(v)) if k == "dollars" else int(v) for k, v in over.items()})
    return out


def check_drifting_bounds(r: Run) -> dict[str, Decimal]:
    """No account ends past its allowance by more than one call's overrun, and a run that
    went past it was stopped at that call; returns the worst excess per dimension."""
    rec = r.rec
    overruns = model_overruns(r)
    reported = sum(
        row.tokens_in + row.tokens_out for row in r.out.rows if row.kind is RowKind.MODEL
    )
    assert rec.ledger.tokens.actual >= reported, "the ledger books all the usage reported"
    worst: dict[str, Decimal] = {}
    for dim in Dimension:
        acct = rec.ledger.account(dim)
        excess = Decimal(acct.actual + acct.reserved - acct.allowance)
        largest = max((Decimal(o.get(dim.value, 0)) for o in overruns), default=Decimal(0))
        assert excess <= largest, (dim, acct, largest)
        worst[dim.value] = max(excess, Decimal(0))
        if acct.actual + acct.reserved + acct.reserve > acct.allowance:  # headroom taken
            assert rec.state in TERMINAL, (dim, rec.state)
            assert overruns and overruns[-1].get(dim.value), "stopped at the call that took it"
    total = {k: sum((Decimal(o.get(k, 0)) for o in overruns), Decimal(0)) for k in worst}
    ledger = rec.ledger.overrun
    assert {k: Decimal(ledger.get(Dimension(k))) for k in worst} == total, "on the ledger"
    return worst


def with_reserve(rng: random.Random, budget: Budget) -> Budget:
    """Half the budgets keep a finalization reserve of tokens and dollars, so admission's
    headroom ends below the allowance and a call that takes the reserve is a breach
    (random_budget keeps none). Not of tool calls: the reconciler's lookups may spend those."""
    if rng.random() < 0.5:
        return budget
    reserve = Amounts.of(tokens=rng.choice([100, 400]), dollars=budget.max_cost / 4)
    return Budget.build(**{**budget.model_dump(), "reserve": reserve})


def test_ten_thousand_runs_with_a_drifting_provider_overrun_by_one_call_at_most() -> None:
    worst: dict[str, Decimal] = {d.value: Decimal(0) for d in Dimension}
    overran = reserved = 0
    for seed in range(10_000):
        rng = random.Random(seed)
        factor = rng.choice([0.5, 1.0, 1.7])
        budget = with_reserve(rng, random_budget(rng))
        reserved += budget.reserve != Amounts()
        r = go(
            random_policy(rng),
            budget,
            backend=random_backend(rng),
            on_unknown=random_rule(rng),
            usage_factor=factor,
        )
        assert r.rec.state in TERMINAL or r.rec.state in SUSPENDED
        for dim, excess in check_drifting_bounds(r).items():
            worst[dim] = max(worst[dim], excess)
        overran += r.rec.ledger.overrun != Amounts()
    print(
        f"\n{overran} of 10000 runs overran a reservation; worst excess past an allowance: "
        f"{ {k: str(v) for k, v in worst.items()} }"
    )
    assert overran > 100, "the drifting provider was seen to overrun"
    assert reserved > 1000, "budgets with a finalization reserve were run"
