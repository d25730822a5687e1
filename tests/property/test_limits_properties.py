"""Properties of ``reins limits``' arithmetic over random outcomes: the binding rule never
accepts more under a lower cap, never charges a run more than it spent or than the cap, and the
sizing rule gives the smallest task count that reaches the target error."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ops.limits.stats import (
    Dim,
    RunOutcome,
    cap_figures,
    quantile,
    relative_standard_error,
    report,
    tasks_for_rse,
)

values = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)
outcomes = st.lists(
    st.builds(
        lambda i, ok, v: RunOutcome(f"t{i}", ok, {Dim.DOLLARS: v}),
        st.integers(0, 10**6),
        st.booleans(),
        values,
    ),
    min_size=1,
    max_size=60,
)
caps = st.floats(min_value=1e-3, max_value=2e4, allow_nan=False)


@given(outcomes, caps, caps)
def test_a_lower_cap_never_accepts_more(rows: list[RunOutcome], a: float, b: float) -> None:
    low, high = sorted((a, b))
    f_low = cap_figures(rows, Dim.DOLLARS, low, None)
    f_high = cap_figures(rows, Dim.DOLLARS, high, None)
    assert f_low.accepted <= f_high.accepted
    assert f_low.total <= f_high.total + 1e-9
    if f_low.cut_off_fraction is not None:
        assert f_high.cut_off_fraction is not None
        assert f_low.cut_off_fraction >= f_high.cut_off_fraction


@given(outcomes, caps)
def test_the_binding_rule_charges_at_most_the_spend_and_the_cap(
    rows: list[RunOutcome], cap: float
) -> None:
    f = cap_figures(rows, Dim.DOLLARS, cap, None)
    spent = sum(o.spend[Dim.DOLLARS] for o in rows)
    assert f.total <= spent + 1e-9
    assert f.total <= cap * len(rows) + 1e-9
    accepted_at_cap = [o for o in rows if o.accepted and o.spend[Dim.DOLLARS] <= cap]
    assert f.accepted == len(accepted_at_cap)
    if f.accepted:
        assert f.cost_per_accepted is not None
        assert math.isclose(f.cost_per_accepted * f.accepted, f.total, rel_tol=1e-9, abs_tol=1e-9)
        # every accepted run's own cost is paid: cost per accepted is at least their mean
        own = sum(o.spend[Dim.DOLLARS] for o in accepted_at_cap) / f.accepted
        assert f.cost_per_accepted >= own - 1e-9
    else:
        assert f.cost_per_accepted is None and f.rse is None


@given(outcomes)
def test_a_cap_above_every_run_changes_nothing(rows: list[RunOutcome]) -> None:
    top = max(o.spend[Dim.DOLLARS] for o in rows) + 1.0
    f = cap_figures(rows, Dim.DOLLARS, top, None)
    assert f.accepted == sum(o.accepted for o in rows)
    assert math.isclose(f.total, sum(o.spend[Dim.DOLLARS] for o in rows), abs_tol=1e-6)
    assert f.cut_off_fraction in (None, 0.0)


@given(st.integers(1, 10_000), st.integers(1, 10_000), st.floats(0.005, 0.5))
def test_tasks_for_target_is_the_smallest_that_reaches_it(a: int, n: int, target: float) -> None:
    accepted = min(a, n)
    need = tasks_for_rse(accepted, n, target)
    assert need is not None
    p = accepted / n

    def rse_at(tasks: int) -> float:  # the same acceptance fraction over more tasks
        return math.sqrt((1 - p) / (p * tasks))

    assert rse_at(max(need, 1)) <= target * (1 + 1e-9)
    if need > 1:
        assert rse_at(need - 1) > target
    assert math.isclose(relative_standard_error(accepted, n) or 0.0, rse_at(n), abs_tol=1e-12)


@given(st.lists(st.integers(0, 100), min_size=1, max_size=200), st.floats(0.0, 1.0))
def test_percentiles_are_observed_values_in_order(vals: list[int], f: float) -> None:
    ordered = sorted(vals)
    q = quantile(ordered, f)
    assert q in vals
    assert quantile(ordered, 0.0) <= q <= quantile(ordered, 1.0) == max(vals)


@given(outcomes)
def test_percentiles_are_of_accepted_runs_only(rows: list[RunOutcome]) -> None:
    rep = report(rows, {Dim.DOLLARS: [1.0]})[Dim.DOLLARS]
    accepted = sorted(o.spend[Dim.DOLLARS] for o in rows if o.accepted)
    assert rep.accepted == len(accepted) and rep.runs == len(rows)
    if accepted:
        assert rep.percentiles["max"] == accepted[-1]
        assert set(rep.percentiles.values()) <= set(accepted)
    else:
        assert rep.percentiles == {}
