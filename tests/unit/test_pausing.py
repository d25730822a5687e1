"""Seed 004 exercise "Where a pause lands", as the formula and the decision."""

from decimal import Decimal

import pytest

from kernel.pausing import boundary_delay_s, choose_pause_mechanism, largest_cap_within, split_cost


def test_where_a_pause_lands() -> None:
    assert boundary_delay_s(8_000, 0.020) == pytest.approx(160.0)
    cap = largest_cap_within(15.0, 0.020)
    assert cap == 750
    cost = split_cost(3_000, cap, 40_000, Decimal(3))
    assert cost.calls == 4
    assert cost.extra_input_tokens == 120_000
    assert cost.extra_dollars == Decimal("0.36")
    assert choose_pause_mechanism(15.0, 8_000, 0.020, cancel_ack_s=2.0) == "streaming_cancel"
    assert choose_pause_mechanism(15.0, 8_000, 0.020, cancel_ack_s=None) == "lower_cap"
    assert choose_pause_mechanism(15.0, 750, 0.020, cancel_ack_s=None) == "reply_boundary"
