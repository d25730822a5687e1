"""Amounts over the cumulative budget dimensions, and model prices.

Money is a ``Decimal`` of dollars so that every figure an auditor reads is exact; counts are
integers. Prices are dollars per million tokens, as providers publish them.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from kernel.fastmodel import construct, pinned_values
from kernel.modeljson import json_native

MILLION = Decimal(1_000_000)
ZERO = Decimal(0)


@pinned_values
class Dimension(StrEnum):
    """A cumulative budget dimension; each has its own account in the ledger."""

    STEPS = "steps"
    TOOL_CALLS = "tool_calls"
    TOKENS = "tokens"
    DOLLARS = "dollars"


@json_native
class Amounts(BaseModel):
    """A vector over the cumulative dimensions: a liability, a usage or a reserve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(0, ge=0)
    tool_calls: int = Field(0, ge=0)
    tokens: int = Field(0, ge=0)
    dollars: Decimal = Field(ZERO, ge=0)

    @classmethod
    def of(
        cls, steps: int = 0, tool_calls: int = 0, tokens: int = 0, dollars: Decimal = ZERO
    ) -> Amounts:
        """Build from values the kernel computed itself (no re-validation on the hot path)."""
        return construct(cls, steps=steps, tool_calls=tool_calls, tokens=tokens, dollars=dollars)

    def get(self, dim: Dimension) -> int | Decimal:
        """The component for one dimension."""
        value: int | Decimal = self.__dict__[dim]
        return value

    def plus(self, other: Amounts) -> Amounts:
        """Componentwise sum."""
        return Amounts.of(
            steps=self.steps + other.steps,
            tool_calls=self.tool_calls + other.tool_calls,
            tokens=self.tokens + other.tokens,
            dollars=self.dollars + other.dollars,
        )


NOTHING = Amounts()
DIMENSIONS: tuple[Dimension, ...] = tuple(Dimension)
DIMENSION_NAMES: tuple[str, ...] = tuple(d.value for d in Dimension)  # the Amounts fields


class ModelPrice(BaseModel):
    """Prices of one model, in dollars per million tokens.

    ``cached_input_per_m`` is what input read from the provider's prompt cache costs;
    ``cache_write_input_per_m`` what input written to it costs, where the provider charges
    writes apart (Anthropic: above the input price); None charges writes as plain input.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_m: Decimal = Field(..., ge=0)
    cached_input_per_m: Decimal = Field(..., ge=0)
    output_per_m: Decimal = Field(..., ge=0)
    cache_write_input_per_m: Decimal | None = Field(None, ge=0)

    @property
    def cache_write_rate(self) -> Decimal:
        """The price of input written to the cache."""
        write = self.cache_write_input_per_m
        return self.input_per_m if write is None else write

    @property
    def worst_input_rate(self) -> Decimal:
        """The most one input token can cost: uncached, or written to the cache if that costs
        more. Admission reserves every input token at this rate."""
        return max(self.input_per_m, self.cache_write_rate)


class Usage(BaseModel):
    """Usage a provider reported for one call: disjoint input categories plus output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uncached_input: int = Field(0, ge=0)
    cached_input: int = Field(0, ge=0)  # read from the provider's prompt cache
    output: int = Field(0, ge=0)
    cache_write_input: int = Field(0, ge=0)  # written to the provider's prompt cache

    @property
    def input(self) -> int:
        """Every input token, whichever way it was priced."""
        return self.uncached_input + self.cached_input + self.cache_write_input

    @property
    def total(self) -> int:
        """Every token the call consumed, cached input counted in full."""
        return self.input + self.output


def model_call_liability(price: ModelPrice, input_tokens: int, output_cap: int) -> Amounts:
    """Equation 2 of seed 004: the whole prompt at the undiscounted input price (or the cache
    write price, where that is higher) plus the full output allowance; one step; the token
    meter sees the input plus the output cap. A cache hit only ever lowers the charge."""
    dollars = (price.worst_input_rate * input_tokens + price.output_per_m * output_cap) / MILLION
    return Amounts.of(steps=1, tokens=input_tokens + output_cap, dollars=dollars)


def model_call_charge(price: ModelPrice, usage: Usage) -> Amounts:
    """The settled charge of one call: cached input at the cached price (seed 004 10.9.3),
    cache writes at the write price."""
    dollars = (
        price.input_per_m * usage.uncached_input
        + price.cached_input_per_m * usage.cached_input
        + price.cache_write_rate * usage.cache_write_input
        + price.output_per_m * usage.output
    ) / MILLION
    return Amounts.of(steps=1, tokens=usage.total, dollars=dollars)


def tool_call_liability(dollar_bound: Decimal) -> Amounts:
    """A tool call's liability: one tool call and the dollar bound its declaration gives."""
    if dollar_bound is ZERO:
        return ONE_TOOL_CALL
    return Amounts.of(tool_calls=1, dollars=dollar_bound)


def tool_call_charge(dollars: Decimal) -> Amounts:
    """The settled charge of one tool call."""
    if dollars is ZERO:
        return ONE_TOOL_CALL
    return Amounts.of(tool_calls=1, dollars=dollars)


# One tool call and no dollars: most calls' liability and charge. Amounts are frozen, so the
# kernel shares this one value (callers pass ``ZERO`` itself for "no dollars").
ONE_TOOL_CALL = Amounts.of(tool_calls=1)
