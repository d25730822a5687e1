"""The budget vector a trajectory runs under.

Cumulative dimensions (steps, tool calls, tokens, dollars) are enforced by the ledger with
bounded-liability admission. Two clocks are enforced by guards: the active-time deadline (model
and tool time; waiting for a person does not count, seed 000) and the wall-clock limit from
submission (queueing, approval waits and backoff all count, seed 004 10.9.1).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernel.amounts import Amounts, Dimension
from kernel.errors import InvalidBudget
from kernel.modeljson import json_native


@json_native
class Budget(BaseModel):
    """Allowances of one trajectory. Defaults are seed 000's (its scenarios run under them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(8, ge=0, description="model calls")
    max_tool_calls: int = Field(6, ge=0)
    max_tokens: int = Field(4000, ge=0, description="model input + output, whole run")
    max_output_tokens: int = Field(300, gt=0, description="cap on one model reply")
    max_fanout: int = Field(4, gt=0, description="most tool calls admitted from one reply")
    deadline_s: float = Field(30.0, gt=0, description="active time: model and tool latency")
    wall_clock_s: float = Field(86_400.0, gt=0, description="from submission, waits included")
    finalize_s: float = Field(
        30.0, gt=0, description="the closing step's own time allowance, from the stop"
    )
    max_cost: Decimal = Field(Decimal("1.00"), ge=0, description="dollars")
    max_repeat: int = Field(2, ge=1, description="times one (tool, args) may be proposed")
    max_stalls: int = Field(3, ge=1, description="consecutive steps without progress")
    max_plan_steps: int = Field(6, ge=1)
    max_replans: int | None = Field(
        None,
        ge=0,
        description="plans accepted after the first (None: the loop shape's own bound)",
    )
    max_same_error: int = Field(3, ge=1, description="same recoverable error in a row")
    reserve: Amounts = Field(default_factory=Amounts, description="finalization reserve")

    @model_validator(mode="after")
    def _reserve_below_allowance(self) -> Budget:
        for dim in Dimension:
            reserve, allowance = self.reserve.get(dim), self.allowance(dim)
            if reserve and reserve >= allowance:
                raise ValueError(
                    f"reserve.{dim.value} ({reserve}) must be below its allowance ({allowance})"
                )
        if self.max_output_tokens > self.max_tokens and self.max_tokens > 0:
            raise ValueError(
                f"max_output_tokens ({self.max_output_tokens}) exceeds max_tokens "
                f"({self.max_tokens})"
            )
        return self

    def allowance(self, dim: Dimension) -> int | Decimal:
        """The allowance of one cumulative dimension."""
        if dim is Dimension.STEPS:
            return self.max_steps
        if dim is Dimension.TOOL_CALLS:
            return self.max_tool_calls
        if dim is Dimension.TOKENS:
            return self.max_tokens
        return self.max_cost

    @classmethod
    def build(cls, **values: Any) -> Budget:
        """Validate a budget, turning pydantic's report into an error that names the field."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise InvalidBudget(_describe(exc)) from None

    def with_overrides(self, pairs: Iterable[str]) -> Budget:
        """Apply ``key=value`` overrides (``reserve.dollars=0.1`` for a reserve component)."""
        values: dict[str, Any] = self.model_dump()
        for pair in pairs:
            key, sep, raw = pair.partition("=")
            key = key.strip()
            if not sep or not key:
                raise InvalidBudget(f"budget override {pair!r} is not of the form key=value")
            if key.startswith("reserve."):
                dim = key.removeprefix("reserve.")
                if dim not in Amounts.model_fields:
                    raise InvalidBudget(f"unknown reserve dimension {dim!r} in {pair!r}")
                values["reserve"] = {**values["reserve"], dim: raw}
                continue
            if key not in type(self).model_fields or key == "reserve":
                known = ", ".join(k for k in type(self).model_fields if k != "reserve")
                raise InvalidBudget(f"unknown budget key {key!r}; known keys: {known}")
            if key == "max_cost":
                try:
                    Decimal(raw)
                except InvalidOperation:
                    raise InvalidBudget(f"max_cost: {raw!r} is not a number") from None
            values[key] = raw
        return type(self).build(**values)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "budget"
        parts.append(f"{loc}: {err['msg']}")
    return "invalid budget: " + "; ".join(parts)
