"""A hard ceiling against a provider that reports more usage than was reserved.

The scripted model here reports 1.7 times the estimate on every call (the tool schemas and the
provider's framing a real API adds). Settlement books the truth, records what went past each
reservation as an overrun on the ledger and in the chain and trace, and the call whose overrun
took a dimension's headroom ends the run with that dimension's stop before anything else is
admitted: no account ends past its allowance by more than that one call's overrun.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from examples.support_store.policies import RefundPolicy
from kernel.amounts import NOTHING, Amounts, Dimension
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.context import KernelContext
from kernel.ledger import Ledger
from kernel.states import LifecycleState, StopReason
from kernel.trace import spans_from_chain
from tests.kernel.harness import go


@pytest.mark.parametrize(
    ("allowance", "reserve"), [(650, 0), (800, 150)], ids=["no-reserve", "finalization-reserve"]
)
def test_a_provider_reporting_1_7x_is_stopped_at_the_call_that_took_the_headroom(
    allowance: int, reserve: int
) -> None:
    # With a finalization reserve the headroom ends below the allowance: the call that takes
    # the reserve stops the run although the allowance itself is not passed.
    budget = Budget.build(
        max_tokens=allowance, max_output_tokens=80, reserve=Amounts.of(tokens=reserve)
    )
    run = go(RefundPolicy(), budget, usage_factor=1.7)
    rec, rows = run.rec, run.out.rows
    models = [r for r in rows if r.kind is RowKind.MODEL]
    overruns = [Amounts(**(r.detail or {}).get("overrun", {})) for r in models]
    assert len(models) >= 2 and all(o.tokens > 0 for o in overruns), "each call overran"
    assert rec.ledger.overrun.tokens == sum(o.tokens for o in overruns), "on the ledger"
    tokens = rec.ledger.tokens
    assert tokens.actual + tokens.reserved > tokens.allowance - tokens.reserve, "it did breach"
    assert tokens.actual + tokens.reserved - tokens.allowance <= overruns[-1].tokens
    headroom_end = tokens.allowance - tokens.reserve
    assert tokens.actual + tokens.reserved - headroom_end <= overruns[-1].tokens
    assert rec.stop_reason is StopReason.MAX_TOKENS and rec.state is LifecycleState.FAILED
    breach = rows.index(models[-1])
    assert [r.kind for r in rows[breach + 1 :]] == [RowKind.STOP], "nothing admitted after"
    spans = spans_from_chain(rows, model="refund-policy")
    chats = [s for s in spans if s.kind == "model"]
    assert [s.attributes["reins.overrun.tokens"] for s in chats] == [o.tokens for o in overruns]


def test_an_honest_provider_leaves_no_overrun() -> None:
    run = go(RefundPolicy(), Budget())
    assert run.rec.stop_reason is StopReason.DONE
    assert run.rec.ledger.overrun == NOTHING
    assert not any("overrun" in (r.detail or {}) for r in run.out.rows)


def test_admission_reserves_for_what_the_estimate_cannot_see() -> None:
    go(RefundPolicy(), Budget())  # the profile below is the example's, with a real provider's
    from examples.support_store import LOCAL_SERVER, make_agent

    scripted = make_agent().profile
    real = make_agent(model=LOCAL_SERVER).profile
    plain, margined = KernelContext(scripted), KernelContext(real)
    assert plain.reserved_input(1_000) == 1_000, "a scripted model sees only the view"
    schemas = margined.unseen_tokens - real.model.framing_tokens
    assert schemas > 0, "the tool schemas are counted"
    assert margined.reserved_input(1_000) == 1_000 + 100 + real.model.framing_tokens + schemas


@pytest.mark.parametrize(
    ("usage", "overrun"),
    [
        (Amounts.of(steps=1, tokens=900), NOTHING),
        (Amounts.of(steps=1, tokens=1_000), NOTHING),
        (Amounts.of(steps=1, tokens=1_700), Amounts.of(tokens=700)),
        (
            Amounts.of(steps=1, tokens=1_000, dollars=Decimal("0.30")),
            Amounts.of(dollars=Decimal("0.10")),
        ),
    ],
)
def test_a_final_settlement_books_the_truth_and_records_what_passed_the_reservation(
    usage: Amounts, overrun: Amounts
) -> None:
    ledger = Ledger.open(Budget.build(max_tokens=1_100, max_cost=Decimal("1")))
    ledger.admit("m1", Amounts.of(steps=1, tokens=1_000, dollars=Decimal("0.20")))
    assert ledger.book("m1", usage) == overrun
    assert ledger.tokens.actual == usage.tokens and ledger.tokens.reserved == 0
    assert ledger.overrun == overrun
    breached = ledger.breached()
    assert (breached is Dimension.TOKENS) == (usage.tokens > 1_100)
