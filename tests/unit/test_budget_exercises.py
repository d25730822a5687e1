"""Seed 004's budget exercises, driven through the ledger's own admit and settle."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from kernel.amounts import (
    Amounts,
    Dimension,
    ModelPrice,
    Usage,
    model_call_charge,
    model_call_liability,
    tool_call_charge,
    tool_call_liability,
)
from kernel.budget import Budget
from kernel.errors import AdmissionRefused
from kernel.ledger import Ledger

DOLLARS = Dimension.DOLLARS


def dollar_ledger(allowance: str, reserve: str, *, steps: int = 1000) -> Ledger:
    budget = Budget.build(
        max_steps=steps,
        max_tool_calls=1000,
        max_tokens=100_000_000,
        max_output_tokens=10_000,
        max_cost=D(allowance),
        reserve=Amounts(dollars=D(reserve)),
    )
    return Ledger.open(budget)


def seed_spend(ledger: Ledger, op: str, dollars: str) -> None:
    """Settled spend from earlier work, entered the only way the ledger allows."""
    ledger.admit(op, Amounts(dollars=D(dollars)), finalizing=True)
    ledger.settle(op, Amounts(dollars=D(dollars)))


def test_napkin_10_2_spend_check_admits_bounded_liability_refuses() -> None:
    ledger = dollar_ledger("3.50", "0.30")
    seed_spend(ledger, "history", "2.58")
    ledger.admit("test-job", tool_call_liability(D("0.50")))
    call = model_call_liability(
        ModelPrice(input_per_m=D(3), cached_input_per_m=D("0.3"), output_per_m=D(15)), 50_000, 4_096
    )
    assert call.dollars == D("0.21144")
    assert ledger.spend_check_headroom(DOLLARS) == D("0.92")  # the spend check would admit
    assert ledger.headroom(DOLLARS) == D("0.12")
    with pytest.raises(AdmissionRefused) as info:
        ledger.admit("call", call)
    assert info.value.dimension == "dollars"
    assert "call" not in ledger.reservations


PRICE_2_10 = ModelPrice(input_per_m=D(2), cached_input_per_m=D("0.20"), output_per_m=D(10))


def admission_after_settlement(defective: bool) -> tuple[Ledger, int]:
    ledger = dollar_ledger("5.00", "0.40")
    seed_spend(ledger, "history", "4.05")
    ledger.admit("test-job", tool_call_liability(D("0.25")))
    call = model_call_liability(PRICE_2_10, 80_000, 2_000)
    assert call.dollars == D("0.18")
    assert ledger.headroom(DOLLARS) == D("0.30")
    assert ledger.spend_check_headroom(DOLLARS) == D("0.95")
    ledger.admit("call", call)
    charge = model_call_charge(
        PRICE_2_10, Usage(uncached_input=20_000, cached_input=60_000, output=900)
    )
    assert charge.dollars == D("0.061")
    released = ledger.settle("call", charge)
    assert released.dollars == D("0.119")
    if defective:
        # The defect under test: the test job's wait timed out and its reservation was dropped
        # as if evidence had settled it at zero. The real ledger has no way to do this without
        # a settlement, which is the point; we model the defect as a zero settlement.
        ledger.settle("test-job", tool_call_charge(D(0)))
    admitted = 0
    while True:
        try:
            ledger.admit(f"tool{admitted}", tool_call_liability(D("0.10")))
        except AdmissionRefused:
            break
        admitted += 1
    return ledger, admitted


def test_admission_after_settlement_settlement_rule() -> None:
    _, admitted = admission_after_settlement(defective=False)
    assert admitted == 2


def test_admission_after_settlement_defective_release_on_timeout() -> None:
    ledger, admitted = admission_after_settlement(defective=True)
    assert admitted == 4
    for i in range(admitted):  # every paid tool call bills its full bound
        ledger.settle(f"tool{i}", tool_call_charge(D("0.10")))
    # the test job's full charge arrives after its reservation was dropped
    ledger.admit("late-test-charge", tool_call_charge(D("0.25")), finalizing=True)
    ledger.settle("late-test-charge", tool_call_charge(D("0.25")))
    left = ledger.dollars.allowance - ledger.dollars.actual
    assert ledger.dollars.reserve - left == D("0.161")


PRICE_3_15 = ModelPrice(input_per_m=D(3), cached_input_per_m=D("0.30"), output_per_m=D(15))


def turn_input(i: int, base: int = 10_000, step: int = 2_000) -> int:
    return base + step * (i - 1)


def run_turns(
    ledger: Ledger, turns: int, *, miss_before: set[int] = frozenset(), all_miss: bool = False
) -> None:  # type: ignore[assignment]
    for i in range(1, turns + 1):
        n = turn_input(i)
        ledger.admit(f"turn{i}", model_call_liability(PRICE_3_15, n, 4_000))
        cached = 0 if (i == 1 or all_miss or i in miss_before) else turn_input(i - 1)
        usage = Usage(uncached_input=n - cached, cached_input=cached, output=300)
        ledger.settle(f"turn{i}", model_call_charge(PRICE_3_15, usage))


def test_cache_miss_exercise_totals() -> None:
    assert sum(turn_input(i) for i in range(1, 26)) == 850_000
    with_reuse = dollar_ledger("100", "0")
    run_turns(with_reuse, 25)
    assert with_reuse.dollars.actual == D("0.5241")
    without = dollar_ledger("100", "0")
    run_turns(without, 25, all_miss=True)
    assert without.dollars.actual == D("2.6625")


def test_cache_miss_exercise_25th_call_headroom() -> None:
    ledger = dollar_ledger("1.00", "0.15")
    run_turns(ledger, 24)
    call = model_call_liability(PRICE_3_15, turn_input(25), 4_000)
    assert call.dollars == D("0.2340")
    ledger.admit("turn25", call)
    assert ledger.headroom(DOLLARS) == D("0.1192")


@pytest.mark.parametrize(
    ("turn", "extra", "absorbable"), [(6, D("0.0486"), 2), (24, D("0.1458"), 0)]
)
def test_cache_miss_exercise_evictions(turn: int, extra: D, absorbable: int) -> None:
    hit, miss = dollar_ledger("100", "0"), dollar_ledger("100", "0")
    run_turns(hit, turn)
    run_turns(miss, turn, miss_before={turn})
    assert miss.dollars.actual - hit.dollars.actual == extra
    call = model_call_liability(PRICE_3_15, turn_input(25), 4_000)
    for evictions in (absorbable, absorbable + 1):
        ledger = dollar_ledger("1.00", "0.15")
        run_turns(ledger, 24)
        for j in range(evictions):  # each eviction's extra charge, billed on its turn
            seed_spend(ledger, f"eviction{j}", str(extra))
        assert ledger.fits(call) is (evictions == absorbable), evictions


def test_cache_miss_exercise_ceiling_for_all_misses() -> None:
    ceiling = D("2.868")
    ledger = dollar_ledger(str(ceiling), "0.15")
    run_turns(ledger, 24, all_miss=True)
    ledger.admit("turn25", model_call_liability(PRICE_3_15, turn_input(25), 4_000))
    assert ledger.headroom(DOLLARS) == 0
    tighter = dollar_ledger(str(ceiling - D("0.0001")), "0.15")
    run_turns(tighter, 24, all_miss=True)
    with pytest.raises(AdmissionRefused):
        tighter.admit("turn25", model_call_liability(PRICE_3_15, turn_input(25), 4_000))
