"""The closing step on the fleet: a stop decided at a router's admission sends the closing call
to a worker as a turn like any other, and the worker's turn ends the run (seed 004 10.4.4)."""

from __future__ import annotations

import pytest

from kernel.chain import RowKind
from kernel.events import CallModel
from kernel.record import SettlementOwner
from kernel.states import LifecycleState, StopReason
from router.wire.notices import NoticeKind
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders

pytestmark = pytest.mark.redis
S = LifecycleState
AGENT = "examples.support_store:agent_reporting"


def submit(inproc: InProcessFleet, first: int) -> str:
    oid = seed_orders(inproc.client, inproc.prefix, first, 1)[0]
    body = {**refund_job(oid, AGENT), "budget": {"max_steps": 4}}
    tid: str = inproc.api.submit("acme", body).trajectory_id
    return tid


def test_a_worker_turn_runs_the_closing_call_and_ends_the_run(inproc: InProcessFleet) -> None:
    tid = submit(inproc, 700)
    inproc.run_until_quiet()
    rec = inproc.load("acme", tid)
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_STEPS
    assert rec.closing_report and "max_steps" in rec.closing_report
    assert rec.turn == 4 and rec.ledger.steps.actual == 4, "the reserve's step, for the report"
    rows = list(inproc.store.read("acme", tid))
    outcomes = [(r.kind, r.outcome) for r in rows]
    at = outcomes.index((RowKind.CONTROL, "finalizing"))
    assert rows[at + 1].kind is RowKind.MODEL and rows[at + 1].detail["purpose"] == "closing"
    assert outcomes[-1] == (RowKind.STOP, "max_steps")
    assert inproc.reports[-1].outcome is NoticeKind.FINISHED, "the worker's turn ended it"


def test_a_redelivered_closing_turn_is_recovered_not_sent_twice(inproc: InProcessFleet) -> None:
    tid = submit(inproc, 710)
    closing = None
    while closing is None:  # run turns until the router sends the closing call
        inproc.cycle()
        for msg in inproc.take():
            rec = inproc.load("acme", tid)
            if rec.state is S.FINALIZING:
                closing = msg
            else:
                inproc.reports.append(inproc.runner.run(msg))
    assert isinstance(closing.commands[0], CallModel)
    report = inproc.runner.run(closing, redelivered=True)  # its first worker died mid-call
    rec = inproc.load("acme", tid)
    assert report.outcome is NoticeKind.FINISHED and rec.state is S.FAILED
    assert rec.closing_report is None, "the call was not sent again"
    op = rec.operations[closing.call_id]
    assert op.settlement_owner is SettlementOwner.RECONCILER and not op.eligible


def test_a_stop_the_admitter_decides_sends_the_closing_call_to_a_worker(
    inproc: InProcessFleet,
) -> None:
    from router.admission.queue import FinalizeNow
    from router.wire.notices import Notice

    tid = submit(inproc, 720)
    notice = Notice(kind=NoticeKind.READY, tenant="acme", trajectory_id=tid, version=1)
    stop = FinalizeNow(tid, StopReason.MAX_TOKENS, "next call too large")
    inproc.service.dispatcher._requeued(notice, stop)
    assert inproc.load("acme", tid).state is S.FINALIZING, "waits for its closing call"
    (msg,) = inproc.take()
    assert isinstance(msg.commands[0], CallModel)
    assert inproc.runner.run(msg).outcome is NoticeKind.FINISHED
    rec = inproc.load("acme", tid)
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_TOKENS
    assert rec.closing_report and "max_tokens" in rec.closing_report


def test_the_ticker_ends_a_run_whose_closing_call_outlived_its_allowance(
    inproc: InProcessFleet,
) -> None:
    from router.process.ticker import Ticker
    from tests.support import ManualClock

    tid = submit(inproc, 730)
    closing = None
    while closing is None:  # the closing call is sent, and its worker never answers
        inproc.cycle()
        for msg in inproc.take():
            if inproc.load("acme", tid).state is S.FINALIZING:
                closing = msg
            else:
                inproc.reports.append(inproc.runner.run(msg))
    waiting = inproc.load("acme", tid)
    assert waiting.closing is not None
    clock = ManualClock(waiting.closing.until - 1.0)
    ticker = Ticker(inproc.api, ("acme",), every_s=5.0, clock=clock)
    assert ticker.tick() == [] and inproc.load("acme", tid) == waiting, "within its allowance"
    clock.set(waiting.closing.until + 6.0)
    assert ticker.tick() == [tid]
    ended = inproc.load("acme", tid)
    assert ended.state is S.FAILED and ended.stop_reason is StopReason.MAX_STEPS
    op = ended.operations[closing.call_id]
    assert op.settlement_owner is SettlementOwner.RECONCILER, "handed off, never refunded"
