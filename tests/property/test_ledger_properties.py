"""Hypothesis over the ledger: a budget is a hard ceiling whatever the sequence of events."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kernel.amounts import Amounts, Dimension
from kernel.budget import Budget
from kernel.errors import AdmissionRefused
from kernel.ledger import Ledger

cents = st.integers(min_value=0, max_value=500).map(lambda c: Decimal(c) / 100)
amounts = st.builds(
    Amounts,
    steps=st.integers(0, 3),
    tool_calls=st.integers(0, 3),
    tokens=st.integers(0, 3000),
    dollars=cents,
)


def shrink(held: Amounts, frac: float) -> Amounts:
    """Some usage up to the reserved bound."""
    return Amounts(
        steps=int(held.steps * frac),
        tool_calls=int(held.tool_calls * frac),
        tokens=int(held.tokens * frac),
        dollars=(held.dollars * Decimal(str(frac))).quantize(Decimal("0.0001")),
    )


class LedgerMachine(RuleBasedStateMachine):
    """Admit, settle (any usage up to the bound), partial settle, and finalization admits."""

    @initialize(
        steps=st.integers(1, 20),
        tools=st.integers(1, 20),
        tokens=st.integers(100, 20000),
        dollars=st.integers(1, 1000).map(lambda c: Decimal(c) / 100),
        reserve_frac=st.sampled_from([0, 0.1, 0.25, 0.5]),
    )
    def open(
        self, steps: int, tools: int, tokens: int, dollars: Decimal, reserve_frac: float
    ) -> None:
        reserve = Amounts(
            steps=int(steps * reserve_frac),
            tool_calls=int(tools * reserve_frac),
            tokens=int(tokens * reserve_frac),
            dollars=(dollars * Decimal(str(reserve_frac))).quantize(Decimal("0.01")),
        )
        self.budget = Budget.build(
            max_steps=steps,
            max_tool_calls=tools,
            max_tokens=tokens,
            max_output_tokens=1,
            max_cost=dollars,
            reserve=reserve,
        )
        self.ledger = Ledger.open(self.budget)
        self.finalizing = False
        self.n = 0
        self.released_without_settle = False

    @rule(liability=amounts)
    def admit(self, liability: Amounts) -> None:
        self.n += 1
        op = f"op{self.n}"
        fits = all(
            (liability.get(d) or 0) <= self.ledger.headroom(d, finalizing=self.finalizing)
            for d in Dimension
        )
        before = self.ledger.model_dump()
        try:
            self.ledger.admit(op, liability, finalizing=self.finalizing)
        except AdmissionRefused:
            assert not fits, "admit refused a liability that fits the headroom"
            assert self.ledger.model_dump() == before, "a refusal changed the ledger"
            return
        assert fits
        assert self.ledger.reservations[op] == liability

    @precondition(lambda self: bool(self.ledger.reservations))
    @rule(pick=st.integers(0, 10_000), frac=st.floats(0, 1), final=st.booleans())
    def settle(self, pick: int, frac: float, final: bool) -> None:
        ops = sorted(self.ledger.reservations)
        op = ops[pick % len(ops)]
        held = self.ledger.reservations[op]
        usage = shrink(held, frac)
        before_actual = self.ledger.settled()
        self.ledger.settle(op, usage, final=final)
        assert self.ledger.settled() == before_actual.plus(usage)
        if final:
            assert op not in self.ledger.reservations

    @rule()
    def enter_finalizing(self) -> None:
        self.finalizing = True

    @invariant()
    def ceiling_holds(self) -> None:
        for d in Dimension:
            a = self.ledger.account(d)
            assert a.actual + a.reserved <= a.allowance, d
            if not self.finalizing:
                assert a.actual + a.reserved <= a.allowance - a.reserve, d

    @invariant()
    def reserved_is_sum_of_reservations(self) -> None:
        total = Amounts()
        for held in self.ledger.reservations.values():
            total = total.plus(held)
        assert self.ledger.outstanding() == total, "a reservation vanished without settlement"


LedgerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestLedger = LedgerMachine.TestCase
