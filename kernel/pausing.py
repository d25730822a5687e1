"""Where a pause lands: the arithmetic behind choosing an output cap or streaming cancellation.

A harness that only checks control at reply boundaries makes a pause wait for the reply in
flight: about ``output_cap x seconds_per_token`` (seed 004 section 10.5.1). Lowering the cap
shortens that wait but splits large proposals into more calls, each resending the context;
streaming cancellation removes the dependence on generation length altogether.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

from kernel.amounts import MILLION


def boundary_delay_s(output_cap: int, seconds_per_token: float) -> float:
    """Worst-case wait before a reply-boundary pause takes effect."""
    return output_cap * seconds_per_token


def largest_cap_within(limit_s: float, seconds_per_token: float) -> int:
    """The largest output cap whose full generation fits within ``limit_s``."""
    return math.floor(limit_s / seconds_per_token + 1e-9)


@dataclass(frozen=True)
class SplitCost:
    """What a lower cap costs a proposal that must be split into complete parts."""

    calls: int
    extra_input_tokens: int
    extra_dollars: Decimal


def split_cost(
    proposal_tokens: int, output_cap: int, context_tokens: int, input_per_m: Decimal
) -> SplitCost:
    """Complete calls needed, and the context resent beyond one call (no cache discount)."""
    calls = math.ceil(proposal_tokens / output_cap)
    extra = (calls - 1) * context_tokens
    return SplitCost(calls, extra, input_per_m * extra / MILLION)


def choose_pause_mechanism(
    requirement_s: float, output_cap: int, seconds_per_token: float, cancel_ack_s: float | None
) -> str:
    """``reply_boundary`` if the current cap already meets the requirement, else
    ``streaming_cancel`` when the serving engine acknowledges a cancel in time, else
    ``lower_cap``."""
    if boundary_delay_s(output_cap, seconds_per_token) <= requirement_s:
        return "reply_boundary"
    if cancel_ack_s is not None and cancel_ack_s <= requirement_s:
        return "streaming_cancel"
    return "lower_cap"
