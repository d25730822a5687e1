"""Cached input in prices and the ledger: reads at the cached rate, writes at the write rate,
and the admission estimate still the worst case (every input token at its dearest rate)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from kernel.amounts import ModelPrice, Usage, model_call_charge, model_call_liability
from kernel.context import KernelContext
from kernel.events import ReplyStatus
from tests.providers.scripts import KernelTurns
from worker.models import ModelReply

D = Decimal
PRICE = ModelPrice(input_per_m=D(3), cached_input_per_m=D("0.30"), output_per_m=D(15))
# Anthropic-style: writing to the cache costs 1.25 times plain input
WRITES = PRICE.model_copy(update={"cache_write_input_per_m": D("3.75")})
FINAL = {"type": "final", "outcome": "completed", "text": "Done."}


def turns(price: ModelPrice) -> KernelTurns:
    k = KernelTurns()
    profile = k.ctx.agent
    k.ctx = KernelContext(
        dataclasses.replace(profile, model=dataclasses.replace(profile.model, price=price))
    )
    return k


def test_cached_reads_are_charged_at_the_cached_rate_and_shown_in_the_chain() -> None:
    k = turns(PRICE)
    cmd = k.admit()
    usage = Usage(uncached_input=200, cached_input=800, output=50)
    result = k.reply(cmd, ModelReply(status=ReplyStatus.COMPLETED, content=FINAL, usage=usage))
    expected = (D(3) * 200 + D("0.30") * 800 + D(15) * 50) / 10**6
    assert k.rec.ledger.dollars.actual == expected
    assert expected < (D(3) * 1000 + D(15) * 50) / 10**6, "the discount reached the ledger"
    row = next(r for r in result.rows if r.kind.value == "model")
    assert row.tokens_in == 1000 and row.tokens_out == 50
    assert row.detail is not None and row.detail["cached_in"] == 800
    assert "cache_write_in" not in row.detail


def test_cache_writes_are_charged_at_the_write_rate() -> None:
    k = turns(WRITES)
    cmd = k.admit()
    usage = Usage(uncached_input=100, cached_input=0, cache_write_input=900, output=10)
    result = k.reply(cmd, ModelReply(status=ReplyStatus.COMPLETED, content=FINAL, usage=usage))
    assert k.rec.ledger.dollars.actual == (D(3) * 100 + D("3.75") * 900 + D(15) * 10) / 10**6
    assert k.rec.ledger.tokens.actual == 1010
    row = next(r for r in result.rows if r.kind.value == "model")
    assert row.tokens_in == 1000 and row.detail is not None and row.detail["cache_write_in"] == 900


def test_writes_without_a_write_price_are_plain_input() -> None:
    usage = Usage(uncached_input=100, cache_write_input=900, output=0)
    assert model_call_charge(PRICE, usage).dollars == D(3) * 1000 / 10**6


def reserved_input(k: KernelTurns, attempt_id: str, cap: int) -> int:
    """The input tokens admission reserved for a call (its tokens less the output cap)."""
    return k.rec.ledger.reservations[attempt_id].tokens - cap


def test_admission_reserves_every_input_token_uncached_even_after_cache_hits() -> None:
    """The estimate stays worst case: a run whose every call hit the cache is still reserved
    at the full input price, since the next call may miss."""
    k = turns(PRICE)
    first = k.admit()
    tokens = reserved_input(k, first.attempt_id, first.max_output_tokens)
    all_cached = Usage(cached_input=tokens, output=1)
    k.reply(first, ModelReply(status=ReplyStatus.COMPLETED, content={"x": 1}, usage=all_cached))
    second = k.admit()
    cap = second.max_output_tokens
    tokens = reserved_input(k, second.attempt_id, cap)
    assert tokens > 0
    held = k.rec.ledger.reservations[second.attempt_id]
    assert held.dollars == (D(3) * tokens + D(15) * cap) / 10**6


def test_with_dearer_cache_writes_the_reservation_prices_input_as_writes() -> None:
    k = turns(WRITES)
    cmd = k.admit()
    cap = cmd.max_output_tokens
    tokens = reserved_input(k, cmd.attempt_id, cap)
    held = k.rec.ledger.reservations[cmd.attempt_id]
    assert held.dollars == (D("3.75") * tokens + D(15) * cap) / 10**6


rates = st.decimals(min_value=0, max_value=100, places=2)


@given(
    input_rate=rates,
    cached_rate=rates,
    write_rate=st.one_of(st.none(), rates),
    output_rate=rates,
    split=st.tuples(st.integers(0, 10_000), st.integers(0, 10_000), st.integers(0, 10_000)),
    output=st.integers(0, 4096),
    extra_output=st.integers(0, 4096),
)
def test_no_split_of_the_input_costs_more_than_its_reservation(
    input_rate: Decimal,
    cached_rate: Decimal,
    write_rate: Decimal | None,
    output_rate: Decimal,
    split: tuple[int, int, int],
    output: int,
    extra_output: int,
) -> None:
    """Whatever share of the input the provider reports as cached or written (and the cached
    rate need not be below the input rate), the charge never passes the liability reserved for
    that input and output cap."""
    price = ModelPrice(
        input_per_m=input_rate,
        cached_input_per_m=min(cached_rate, input_rate),  # a cache read is never dearer
        cache_write_input_per_m=write_rate,
        output_per_m=output_rate,
    )
    uncached, cached, written = split
    usage = Usage(
        uncached_input=uncached, cached_input=cached, cache_write_input=written, output=output
    )
    liability = model_call_liability(price, usage.input, output + extra_output)
    charge = model_call_charge(price, usage)
    assert charge.dollars <= liability.dollars
    assert charge.tokens <= liability.tokens
