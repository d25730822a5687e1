"""The ledger: what makes a budget a hard ceiling.

Per dimension an account keeps the allowance, the settled ``actual``, the ``reserved`` sum of
outstanding reservations and the protected finalization ``reserve``. Admission is
bounded-liability admission (seed 004 equation 1), in every dimension::

    actual + reserved + liability + reserve <= allowance

with the reserve dropped only in FINALIZING. Only evidence settles or releases a reservation.
Usage a final settlement finds beyond its reservation is booked in full (``actual`` is the
truth) and also added to ``overrun``, so the breach is on the ledger, never hidden.
Methods change the ledger in place, never an account: a ledger's copy shares the accounts, and
a write replaces the account it changes. Design: docs/adr/0101-ledger-bounded-liability.md.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernel.amounts import DIMENSION_NAMES, DIMENSIONS, NOTHING, ZERO, Amounts, Dimension
from kernel.budget import Budget
from kernel.errors import AdmissionRefused, InvalidInput, UnknownReference
from kernel.fastmodel import construct, shallow_copy
from kernel.modeljson import json_native


@json_native
class CountAccount(BaseModel):
    """One integer dimension (steps, tool calls, tokens)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    allowance: int = Field(..., ge=0)
    actual: int = 0
    reserved: int = 0
    reserve: int = 0


@json_native
class MoneyAccount(BaseModel):
    """The dollar dimension, exact to the cent fraction."""

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    allowance: Decimal = Field(..., ge=0)
    actual: Decimal = ZERO
    reserved: Decimal = ZERO
    reserve: Decimal = ZERO


Account = CountAccount | MoneyAccount


@json_native
class Ledger(BaseModel):
    """Accounts per dimension plus the outstanding reservations by operation id."""

    model_config = ConfigDict(extra="forbid")

    steps: CountAccount
    tool_calls: CountAccount
    tokens: CountAccount
    dollars: MoneyAccount
    reservations: dict[str, Amounts] = Field(default_factory=dict)
    overrun: Amounts = NOTHING  # usage settled beyond its reservation, summed

    @classmethod
    def open(cls, budget: Budget) -> Ledger:
        """A fresh ledger with the budget's allowances and finalization reserve."""
        r = budget.reserve  # a validated budget: its figures need no second check
        return construct(
            cls,
            steps=construct(CountAccount, allowance=budget.max_steps, reserve=r.steps),
            tool_calls=construct(
                CountAccount, allowance=budget.max_tool_calls, reserve=r.tool_calls
            ),
            tokens=construct(CountAccount, allowance=budget.max_tokens, reserve=r.tokens),
            dollars=construct(MoneyAccount, allowance=budget.max_cost, reserve=r.dollars),
        )

    def clone(self) -> Ledger:
        """A copy whose accounts and reservation table can change independently (the accounts
        are shared until a write replaces one; see the module docstring)."""
        new = shallow_copy(self)
        new.__dict__["reservations"] = dict(self.reservations)
        return new

    def account(self, dim: Dimension) -> Account:
        """The account of one dimension."""
        acct: Account = self.__dict__[dim]
        return acct

    # --- reading -------------------------------------------------------------------------

    def headroom(self, dim: Dimension, *, finalizing: bool = False) -> int | Decimal:
        """What a new liability may still take in this dimension (equation 1 rearranged)."""
        a = self.account(dim)
        protected = 0 if finalizing else a.reserve
        return a.allowance - a.actual - a.reserved - protected

    def spend_check_headroom(self, dim: Dimension) -> int | Decimal:
        """What a naive spend check would see: allowance minus settled spend only."""
        a = self.account(dim)
        return a.allowance - a.actual

    def first_misfit(self, liability: Amounts, *, finalizing: bool = False) -> Dimension | None:
        """The first dimension in which the liability does not fit, or None if it fits."""
        accounts, amounts = self.__dict__, liability.__dict__
        for dim in DIMENSIONS:
            needed = amounts[dim]
            if needed:
                a = accounts[dim]  # :meth:`headroom`, inline: this runs at every admission
                protected = 0 if finalizing else a.reserve
                if needed > a.allowance - a.actual - a.reserved - protected:
                    return dim
        return None

    def fits(self, liability: Amounts, *, finalizing: bool = False) -> bool:
        """True when bounded-liability admission would admit this liability."""
        return self.first_misfit(liability, finalizing=finalizing) is None

    def breached(self) -> Dimension | None:
        """The first dimension whose headroom an overrun took (settled plus reserved past the
        allowance less the reserve): no call can be admitted in it any more."""
        accounts = self.__dict__
        for dim in DIMENSIONS:
            a = accounts[dim]
            if a.actual + a.reserved + a.reserve > a.allowance:
                return dim
        return None

    def used_fraction(self, dim: Dimension) -> float:
        """Settled plus reserved over the allowance (seed 004 10.9.4 counts reservations)."""
        a = self.account(dim)
        if not a.allowance:
            return 1.0
        return float((a.actual + a.reserved) / a.allowance)

    def outstanding(self) -> Amounts:
        """The sum of outstanding reservations."""
        return Amounts.of(
            steps=self.steps.reserved,
            tool_calls=self.tool_calls.reserved,
            tokens=self.tokens.reserved,
            dollars=self.dollars.reserved,
        )

    def settled(self) -> Amounts:
        """The settled consumption."""
        return Amounts.of(
            steps=self.steps.actual,
            tool_calls=self.tool_calls.actual,
            tokens=self.tokens.actual,
            dollars=self.dollars.actual,
        )

    # --- writing -------------------------------------------------------------------------

    def admit(self, op_id: str, liability: Amounts, *, finalizing: bool = False) -> None:
        """Reserve ``liability`` for operation ``op_id`` or raise :class:`AdmissionRefused`.

        After a successful call the reservation is outstanding until :meth:`settle`; on refusal
        nothing changed.
        """
        if op_id in self.reservations:
            raise InvalidInput(f"operation {op_id} already holds a reservation")
        dim = self.first_misfit(liability, finalizing=finalizing)
        if dim is not None:
            raise AdmissionRefused(
                dim.value, liability.get(dim), self.headroom(dim, finalizing=finalizing)
            )
        self.reservations[op_id] = liability
        accounts, amounts = self.__dict__, liability.__dict__
        for name in DIMENSION_NAMES:
            amount = amounts[name]
            if amount:
                account = accounts[name] = shallow_copy(accounts[name])  # see the module docstring
                account.__dict__["reserved"] += amount

    def settle(self, op_id: str, usage: Amounts, *, final: bool = True) -> Amounts:
        """Record evidence of ``usage`` against the reservation of ``op_id``.

        The usage moves into ``actual``. With ``final`` (terminal billing evidence) the whole
        reservation is released; otherwise the reservation shrinks by the usage and the rest
        stays owed. Returns what went back to headroom: the reservation less the usage on a
        final settlement, nothing on a partial one. Missing usage is not a reason to call this:
        a reservation without evidence stays where it is.
        """
        held = self.reservations.get(op_id)
        if held is None:
            raise UnknownReference(f"no reservation for operation {op_id}")
        self.book(op_id, usage, final=final)
        return _clamped_minus(held, usage) if final else NOTHING

    def book(self, op_id: str, usage: Amounts, *, final: bool = True) -> Amounts:
        """:meth:`settle` without working out what went back to headroom (the kernel's path:
        it never reads that figure, and building it costs as much as the settlement). Returns
        the overrun: what a final settlement's usage took beyond the reservation (usually
        :data:`NOTHING`)."""
        held = self.reservations.get(op_id)
        if held is None:
            raise UnknownReference(f"no reservation for operation {op_id}")
        if final:
            remaining = None
            consumed = held
        else:
            remaining = _clamped_minus(held, usage)
            consumed = _clamped_minus(held, remaining)
        accounts, used, freed = self.__dict__, usage.__dict__, consumed.__dict__
        over: dict[str, Any] | None = None
        for name in DIMENSION_NAMES:
            spent, released = used[name], freed[name]
            if not (spent or released) and name != Dimension.DOLLARS:
                continue  # integer zeros change nothing (a Decimal zero can: its exponent)
            account = accounts[name] = shallow_copy(accounts[name])  # see the module docstring
            figures = account.__dict__
            figures["actual"] += spent
            figures["reserved"] -= released
            if final and spent > released:  # usage beyond what was reserved for it
                over = over if over is not None else {}
                over[name] = spent - released
        if remaining is None:
            del self.reservations[op_id]
        else:
            self.reservations[op_id] = remaining
        if over is None:
            return NOTHING
        extra = Amounts.of(**over)
        self.__dict__["overrun"] = self.overrun.plus(extra)
        return extra


def _clamped_minus(a: Amounts, b: Amounts) -> Amounts:
    return Amounts.of(
        steps=max(0, a.steps - b.steps),
        tool_calls=max(0, a.tool_calls - b.tool_calls),
        tokens=max(0, a.tokens - b.tokens),
        dollars=max(ZERO, a.dollars - b.dollars),
    )
