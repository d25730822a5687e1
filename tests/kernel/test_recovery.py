"""Recover: a turn stranded on a dead worker carries on from the record alone."""

from __future__ import annotations

import dataclasses

from examples.support_store import refund_tool
from kernel.context import MAX_RECOVERIES
from kernel.events import CallModel, DispatchTool, Enqueue, LookupEffect, Recover
from kernel.record import OpStatus
from kernel.states import LifecycleState, StopReason
from kernel.tools import Catalog, OnUnknown
from tests.kernel.driver import PLAN, REFUND, Driver

S = LifecycleState


def test_stranded_model_call_keeps_its_reservation_and_cannot_act_later() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    call = d.admit()
    epoch = d.rec.control_epoch
    d.apply(Recover(now=d.now, worker="w1"))
    assert d.rec.state is S.READY and d.commands(Enqueue)
    assert d.rec.control_epoch == epoch + 1
    assert d.rec.operations[call.call_id].status is OpStatus.UNKNOWN
    assert call.attempt_id in d.rec.ledger.reservations, "may have been sent: still reserved"
    late = d.reply(call, REFUND)
    assert late.quarantined is not None and not d.commands(DispatchTool)
    assert call.attempt_id not in d.rec.ledger.reservations, "evidence settles it"
    assert isinstance(d.admit(), CallModel), "the next turn is admitted normally"


def waiting_on_refund(rule: OnUnknown) -> tuple[Driver, DispatchTool]:
    d = Driver()
    tools = {**d.ctx.agent.catalog.tools, "issue_refund": refund_tool(rule).spec}
    d.ctx = dataclasses.replace(
        d.ctx, agent=dataclasses.replace(d.ctx.agent, catalog=Catalog(tools))
    )
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), REFUND)
    (dispatch,) = d.commands(DispatchTool)
    return d, dispatch


def test_stranded_write_with_resend_is_sent_again_under_the_same_key() -> None:
    d, first = waiting_on_refund(OnUnknown.RESEND)
    d.apply(Recover(now=d.now))
    (again,) = d.commands(DispatchTool)
    assert again.idempotency_key == first.idempotency_key
    assert first.idempotency_key.startswith("t1:s2:issue_refund:")
    assert again.attempt_id != first.attempt_id and again.call_id == first.call_id
    assert again.attempt_id in d.rec.ledger.reservations


def test_stranded_write_with_lookup_asks_the_backend() -> None:
    d, first = waiting_on_refund(OnUnknown.LOOKUP)
    d.apply(Recover(now=d.now))
    (look,) = d.commands(LookupEffect)
    assert look.idempotency_key == first.idempotency_key
    assert not d.commands(DispatchTool)


def test_stranded_write_with_stop_ends_unknown_outcome() -> None:
    d, first = waiting_on_refund(OnUnknown.STOP)
    d.apply(Recover(now=d.now))
    assert d.rec.stop_reason is StopReason.UNKNOWN_OUTCOME
    assert first.attempt_id in d.rec.ledger.reservations


def test_recover_on_a_ready_trajectory_requeues_it() -> None:
    d = Driver()
    res = d.apply(Recover(now=0.0))
    assert d.commands(Enqueue) and res.note is not None


def test_finalize_between_turns_ends_the_run_with_the_given_stop() -> None:
    from kernel.events import Finalize, Finish

    d = Driver()
    d.reply(d.admit(), PLAN)
    d.apply(Finalize(now=d.now, stop=StopReason.MAX_TOKENS, detail="next call over largest"))
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.MAX_TOKENS
    assert d.commands(Finish)


def test_finalize_is_refused_while_a_turn_is_in_flight() -> None:
    import pytest

    from kernel.errors import IllegalTransition
    from kernel.events import Finalize

    d = Driver()
    d.admit()
    before = d.rec.to_json()
    with pytest.raises(IllegalTransition):
        d.apply(Finalize(now=d.now, stop=StopReason.MAX_TOKENS))
    assert d.rec.to_json() == before


def test_recoveries_are_no_steps_of_the_agent_and_never_count_as_stalls() -> None:
    """A fault of the fleet is not the agent's: a turn recovered again and again (more times
    than the stall limit) leaves the run READY with no stall counted."""
    d = Driver()
    d.reply(d.admit(), PLAN)
    stalls = d.rec.stalls
    for n in range(1, d.rec.budget.max_stalls + 2):
        d.admit()
        d.apply(Recover(now=d.now, worker="w1"))
        assert d.rec.state is S.READY and d.commands(Enqueue), f"recovery {n} queues it again"
        assert d.rec.stalls == stalls and d.rec.recoveries == n
    d.reply(d.admit(), REFUND)
    (refund,) = d.commands(DispatchTool)
    d.result(refund, {"status": "ok", "refunded_cents": 3000})
    assert d.rec.recoveries == 0, "a turn that ended on its own starts the count again"


def test_a_turn_recovered_past_the_bound_ends_the_run_with_its_own_detail() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    for _ in range(MAX_RECOVERIES):
        d.admit()
        d.apply(Recover(now=d.now, worker="w1"))
        assert d.rec.state is S.READY
    d.admit()
    d.apply(Recover(now=d.now, worker="w1"))
    assert d.rec.state is S.FAILED and d.rec.stop_reason is StopReason.FAILED
    assert d.last is not None
    (stop,) = [row for row in d.last.rows if row.kind.value == "stop"]
    assert stop.error is not None and f"recovered {MAX_RECOVERIES + 1} times" in stop.error
