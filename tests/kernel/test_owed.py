"""What an ended run still owes: the reconciler's lookups and write-offs (kernel.owed)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from examples.support_store import refund_tool
from kernel.amounts import Amounts, Dimension
from kernel.budget import Budget
from kernel.errors import IllegalTransition
from kernel.events import DispatchTool, LookupEffect, Reconcile, ToolResulted
from kernel.owed import MAX_LOOKUPS
from kernel.record import ControlKind, OpStatus, SettlementOwner
from kernel.states import LifecycleState, StopReason
from kernel.tools import Catalog, OnUnknown
from tests.kernel.driver import PLAN, REFUND, Driver

S = LifecycleState
BUDGET = Budget(max_steps=20, max_tool_calls=20, max_tokens=100_000, deadline_s=1000)


def killed_mid_refund(
    rule: OnUnknown = OnUnknown.LOOKUP, budget: Budget = BUDGET
) -> tuple[Driver, DispatchTool]:
    """The refund is in flight when an operator kills the run: its outcome is unknown."""
    d = Driver(budget)
    paid = dataclasses.replace(refund_tool(rule).spec, liability=Decimal("0.05"))
    tools = {**d.ctx.agent.catalog.tools, "issue_refund": paid}
    d.ctx = dataclasses.replace(
        d.ctx, agent=dataclasses.replace(d.ctx.agent, catalog=Catalog(tools))
    )
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), REFUND)
    (dispatch,) = d.commands(DispatchTool)
    d.control(ControlKind.KILL)
    assert d.rec.stop_reason is StopReason.KILLED
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.UNKNOWN and op.settlement_owner is SettlementOwner.RECONCILER
    return d, dispatch


def reconcile(d: Driver) -> list[LookupEffect]:
    d.now += 60
    d.apply(Reconcile(now=d.now))
    return d.commands(LookupEffect)


def answer(d: Driver, look: LookupEffect, result: dict[str, Any], **extra: Any) -> None:
    d.now += 0.1
    d.apply(
        ToolResulted(
            now=d.now,
            call_id=look.call_id,
            attempt_id=look.attempt_id,
            result=result,
            latency_s=0.1,
            looked_up=True,
            **extra,
        )
    )


def rows(d: Driver, outcome: str) -> list[Any]:
    return [r for h in d.history for r in h.rows if r.outcome == outcome]


def test_a_write_the_lookup_finds_is_settled_at_its_charge_and_the_ledger_closes() -> None:
    d, dispatch = killed_mid_refund()
    spent = d.rec.ledger.dollars.actual  # the model calls'
    (look,) = reconcile(d)
    assert look.idempotency_key == dispatch.idempotency_key
    assert look.fence > dispatch.fence, "the lookup shuts out the attempt it asks about"
    assert not d.commands(DispatchTool), "an ended run sends nothing again"
    stored = {"status": "ok", "refund_id": "rf_1", "amount_cents": 3000}
    answer(d, look, stored, charge=Decimal("0.02"))
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.SETTLED and op.evidence is not None
    assert op.evidence["reconciled"] == "found"
    led = d.rec.ledger
    assert not led.reservations, "the ledger closes"
    assert led.tool_calls.actual == 2, "the refund and its lookup"
    assert led.dollars.actual == spent + Decimal("0.02"), "its bill, not the bound of 0.05"
    assert rows(d, "reconciled")[0].detail["effect"] == "found"
    assert d.rec.state is S.CANCELED, "reconciling never reopens a run"


def test_a_write_the_lookup_finds_absent_is_settled_without_effect_and_never_resent() -> None:
    d, dispatch = killed_mid_refund()
    spent = d.rec.ledger.dollars.actual  # the model calls'
    (look,) = reconcile(d)
    answer(d, look, {"status": "absent"})
    op = d.rec.operations[dispatch.call_id]
    assert op.status is OpStatus.SETTLED and op.evidence is not None
    assert op.evidence["reconciled"] == "absent"
    assert not d.commands(DispatchTool)
    assert not d.rec.ledger.reservations
    assert d.rec.ledger.dollars.actual == spent, "no effect, no charge"


def test_an_answer_that_cannot_tell_leaves_it_owed_and_the_next_pass_asks_again() -> None:
    d, dispatch = killed_mid_refund()
    (first,) = reconcile(d)
    answer(d, first, {"status": "unknown"})
    assert d.rec.operations[dispatch.call_id].open
    (second,) = reconcile(d)
    assert second.attempt_id != first.attempt_id and second.fence > first.fence
    answer(d, second, {"status": "absent"})
    assert not d.rec.ledger.reservations


def test_a_write_whose_lookups_go_unanswered_is_written_off_at_its_worst_case() -> None:
    d, dispatch = killed_mid_refund()
    held = d.rec.ledger.reservations[dispatch.attempt_id]
    spent = d.rec.ledger.dollars.actual
    for _ in range(MAX_LOOKUPS):
        assert len(reconcile(d)) == 1  # sent; its worker died before the answer
    assert reconcile(d) == [], "bounded: no sixth lookup"
    op = d.rec.operations[dispatch.call_id]
    assert not op.open and op.evidence is not None
    assert (op.evidence["reconciled"], op.evidence["effect"]) == ("written_off", "unknown")
    led = d.rec.ledger
    assert not led.reservations
    assert held.dollars == Decimal("0.05")
    assert led.dollars.actual == spent + held.dollars, "charged in full: nothing released"
    assert led.tool_calls.actual == 1 + MAX_LOOKUPS


def test_a_write_that_cannot_be_asked_is_written_off_with_its_effect_unknown() -> None:
    d, dispatch = killed_mid_refund(OnUnknown.RESEND)
    assert reconcile(d) == []
    op = d.rec.operations[dispatch.call_id]
    assert op.evidence is not None and op.evidence["effect"] == "unknown"
    assert not d.rec.ledger.reservations
    (row,) = rows(d, "written_off")
    assert row.detail["why"] == "no lookup"


def test_the_finalization_reserve_funds_the_lookup_of_a_run_that_spent_its_calls() -> None:
    funded = Budget(
        max_steps=20,
        max_tool_calls=2,
        max_tokens=100_000,
        deadline_s=1000,
        reserve=Amounts.of(tool_calls=1),
    )
    d, _ = killed_mid_refund(budget=funded)
    assert d.rec.ledger.headroom(Dimension.TOOL_CALLS) == 0, "spent, but for the reserve"
    assert len(reconcile(d)) == 1, "funded from the reserve"
    unfunded = Budget(max_steps=20, max_tool_calls=1, max_tokens=100_000, deadline_s=1000)
    d, _ = killed_mid_refund(budget=unfunded)
    assert reconcile(d) == []
    (row,) = rows(d, "written_off")
    assert row.detail["why"] == "no budget left for a lookup"
    assert not d.rec.ledger.reservations


def test_a_model_call_whose_bill_never_came_is_charged_its_reservation() -> None:
    d = Driver(BUDGET)
    call = d.admit()
    held = d.rec.ledger.reservations[call.attempt_id]
    d.control(ControlKind.KILL)
    assert reconcile(d) == []
    led = d.rec.ledger
    assert not led.reservations and led.tokens.actual == held.tokens
    (row,) = rows(d, "written_off")
    assert row.kind == "model" and row.detail["effect"] == "none"


def test_reconcile_on_a_live_run_is_refused_and_changes_nothing() -> None:
    d = Driver(BUDGET)
    d.to_reading()
    before = d.rec.to_json()
    with pytest.raises(IllegalTransition, match="its own"):
        d.apply(Reconcile(now=d.now))
    assert d.rec.to_json() == before


def test_reconcile_with_nothing_owed_writes_nothing() -> None:
    d = Driver(BUDGET)
    d.reply(d.admit(), {"type": "final", "outcome": "completed", "text": "x"})
    before = d.rec
    res = d.apply(Reconcile(now=d.now))
    assert res.record is before and res.note == "nothing owed"


ANSWERS = st.lists(st.sampled_from(["found", "absent", "unknown", "lost"]), max_size=8)


@settings(max_examples=200, deadline=None)
@given(ANSWERS, st.sampled_from([OnUnknown.LOOKUP, OnUnknown.RESEND, OnUnknown.STOP]))
def test_the_ledger_of_an_ended_run_closes_within_the_bound(
    answers: list[str], rule: OnUnknown
) -> None:
    """Whatever the lookups answer (or if their answers are lost), at most MAX_LOOKUPS + 1
    passes close the ledger, never above its allowance, never reopening the run."""
    d, dispatch = killed_mid_refund(rule)
    replies = iter(answers)
    for _ in range(MAX_LOOKUPS + 1):
        for look in reconcile(d):
            reply = next(replies, "lost")
            if reply == "found":
                answer(d, look, {"status": "ok", "refund_id": "rf_1"}, charge=Decimal("0.01"))
            elif reply != "lost":
                answer(d, look, {"status": reply})
    led = d.rec.ledger
    assert not led.reservations, "the ledger closes"
    assert not d.rec.operations[dispatch.call_id].open
    for dim in Dimension:
        acct = led.account(dim)
        assert acct.actual <= acct.allowance, dim
    assert d.rec.state is S.CANCELED
