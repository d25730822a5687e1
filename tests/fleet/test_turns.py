"""The dispatch loop and the turn runner together, in one process on the real Redis.

No Celery here: the router's sender collects turn messages and the test hands them to the turn
runner, so each case controls exactly which message runs when (a duplicate, a redelivery, a
pause landing mid-call).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from typing import Any

import pytest

from kernel.events import CallModel, DispatchTool, ReplyStatus
from kernel.record import OpKind, OpStatus, SettlementOwner
from kernel.states import LifecycleState, StopReason
from router.process.stranded import StrandedTurns
from router.wire.feed import CancelListener
from router.wire.notices import NoticeKind
from router.wire.turns import TurnMessage
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.support import ManualClock
from worker.models import ModelReply

pytestmark = pytest.mark.redis
S = LifecycleState


def one_turn_message(inproc: InProcessFleet) -> TurnMessage:
    inproc.cycle()
    sent = inproc.take()
    assert len(sent) == 1
    return sent[0]


def test_jobs_of_three_tenants_run_to_done_one_message_per_turn(inproc: InProcessFleet) -> None:
    orders = seed_orders(inproc.client, inproc.prefix, 100, 3)
    ids = [
        (tenant, inproc.api.submit(tenant, refund_job(oid)).trajectory_id)
        for tenant, oid in zip(("acme", "globex", "initech"), orders, strict=True)
    ]
    turns = inproc.run_until_quiet()
    records = [inproc.load(t, i) for t, i in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * 3
    assert turns == sum(r.turn for r in records), "one turn message per model call"
    effects = Counter(tuple(e) for e in inproc.state.effects())
    for oid in orders:
        assert effects[("refund", oid, 3000)] == 1
        assert effects[("email", oid)] == 1
    assert all(r.outcome in (NoticeKind.READY, NoticeKind.FINISHED) for r in inproc.reports)


def test_a_duplicate_message_is_ignored_with_its_reason(
    inproc: InProcessFleet, caplog: pytest.LogCaptureFixture
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 200, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    msg = one_turn_message(inproc)
    assert isinstance(msg.commands[0], CallModel) and len(msg.commands) == 1
    inproc.runner.run(msg)
    before = inproc.load("acme", tid).to_json()
    chain = len(inproc.store.read("acme", tid))
    depth = inproc.feed.depth()
    with caplog.at_level(logging.WARNING, logger="reins.worker.turn"):
        report = inproc.runner.run(msg)  # Celery delivers it again
    assert report.outcome is NoticeKind.IDLE and "stale version" in report.reason
    assert inproc.load("acme", tid).to_json() == before, "the record did not change"
    assert len(inproc.store.read("acme", tid)) == chain
    assert "stale version" in caplog.text and tid in caplog.text
    assert inproc.feed.depth() == depth + 1, "one notice, so the router settles the turn"


def test_a_message_under_another_epoch_or_for_a_call_not_in_flight_is_ignored(
    inproc: InProcessFleet, caplog: pytest.LogCaptureFixture
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 300, 1)[0]
    tid = inproc.api.submit("globex", refund_job(oid)).trajectory_id
    msg = one_turn_message(inproc)
    before = inproc.load("globex", tid).to_json()
    stale_epoch = dataclasses.replace(msg, epoch=msg.epoch + 1)
    cmd = msg.commands[0]
    assert isinstance(cmd, CallModel)
    other_call = dataclasses.replace(
        msg, commands=(cmd.model_copy(update={"call_id": f"{tid}/m9"}),)
    )
    with caplog.at_level(logging.WARNING, logger="reins.worker.turn"):
        assert "stale epoch" in inproc.runner.run(stale_epoch).reason
        assert "not in flight" in inproc.runner.run(other_call).reason
    assert inproc.load("globex", tid).to_json() == before
    assert "stale epoch" in caplog.text and "not in flight" in caplog.text
    inproc.runner.run(msg)  # the real one still works
    assert inproc.load("globex", tid).record_version > msg.version


class PausedMidCall:
    """A model that, while its call is in flight, has an operator pause the trajectory, then
    waits on its cancel token as a streaming provider does; it answers COMPLETED if the
    cancel never comes."""

    def __init__(self, inproc: InProcessFleet, tenant: str, tid: str) -> None:
        self.inproc, self.tenant, self.tid = inproc, tenant, tid
        self.ack: dict[str, Any] = {}
        self.canceled = False

    def call(self, view: str, max_out: int, timeout: float, **kw: Any) -> ModelReply:
        cancel: threading.Event = kw["cancel"]
        self.ack = self.inproc.api.control(self.tenant, self.tid, "pause", "ops")
        self.canceled = cancel.wait(10)
        if self.canceled:
            return ModelReply(status=ReplyStatus.CANCELED, partial='{"type": "pl', latency_s=0.1)
        return ModelReply(status=ReplyStatus.COMPLETED, content={"type": "final"}, latency_s=0.1)


def test_a_pause_during_the_model_call_cancels_it_and_quarantines_the_reply(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 400, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    msg = one_turn_message(inproc)
    model = PausedMidCall(inproc, "initech", tid)
    inproc.runner.tools.model = lambda ref, goal: model  # type: ignore[method-assign]
    listener = CancelListener(inproc.feed, inproc.runner.calls_in_flight.cancel)
    listener.start()
    try:
        report = inproc.runner.run(msg)
    finally:
        listener.stop()
    assert model.ack["admission_stopped"] and model.ack["outstanding"] == [msg.call_id]
    assert model.canceled, "the cancel published by the control request reached the stream"
    rec = inproc.load("initech", tid)
    assert rec.state is S.PAUSED and report.outcome is NoticeKind.IDLE
    op = rec.operations[msg.call_id]
    assert op.evidence is not None and op.evidence["quarantined"] and not op.eligible
    assert op.evidence["status"] == "CANCELED"
    assert inproc.state.effects() == [], "nothing was dispatched from the reply"


def test_a_redelivered_turn_is_recovered_from_the_record_not_sent_again(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 500, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    msg = one_turn_message(inproc)
    calls: list[str] = []
    real = inproc.runner.tools.model

    def counting(ref: str, goal: str) -> Any:
        calls.append(ref)
        return real(ref, goal)

    inproc.runner.tools.model = counting  # type: ignore[method-assign]
    report = inproc.runner.run(msg, redelivered=True)  # its first worker died mid-call
    assert calls == [], "a call that may have been sent is not sent again"
    rec = inproc.load("acme", tid)
    assert rec.state is S.READY and report.outcome is NoticeKind.READY
    op = rec.operations[msg.call_id]
    assert op.kind is OpKind.MODEL and op.status is OpStatus.UNKNOWN and not op.eligible
    again = inproc.runner.run(msg, redelivered=True)  # and once more: it only requeues
    assert again.advanced == 0 and inproc.load("acme", tid).to_json() == rec.to_json()
    inproc.run_until_quiet()
    assert inproc.load("acme", tid).stop_reason is StopReason.DONE


def test_a_turn_canceled_before_its_worker_starts_it_ends_when_the_message_arrives(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 550, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    msg = one_turn_message(inproc)  # admitted: the message waits in the worker's queue
    ack = inproc.api.control("acme", tid, "cancel", "ops")
    assert ack["outstanding"] == [msg.call_id] and not ack["running_work_stopped"]
    waiting = inproc.load("acme", tid)
    assert waiting.state is S.CALLING_MODEL and waiting.control_epoch > msg.epoch
    calls: list[str] = []
    inproc.runner.tools.model = lambda ref, goal: calls.append(ref)  # type: ignore[method-assign]
    report = inproc.runner.run(msg)
    assert calls == [], "no call is sent for a run that was canceled"
    rec = inproc.load("acme", tid)
    assert rec.state is S.CANCELED and rec.stop_reason is StopReason.CANCELED
    assert report.outcome is NoticeKind.FINISHED
    op = rec.operations[msg.call_id]
    # A copy may yet send it: its reservation goes to the reconciler, never assumed unspent.
    assert not op.eligible and op.status is OpStatus.HANDED_OFF
    assert op.settlement_owner is SettlementOwner.RECONCILER
    again = inproc.runner.run(msg)  # a second copy: the run has ended, nothing changes
    assert again.outcome is NoticeKind.IDLE and inproc.load("acme", tid).to_json() == rec.to_json()


class DiesInTheRefund(BaseException):
    """Stands for the worker process dying while the refund is on the wire."""


def test_a_turn_stranded_between_the_refund_and_its_result_is_swept_with_one_refund(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 600, 1)[0]
    tid = inproc.api.submit("globex", refund_job(oid)).trajectory_id
    backend = inproc.backend
    real_call = backend.call

    def dies(user: str, tool: str, args: dict[str, Any], key: str, *a: Any, **kw: Any) -> Any:
        out = real_call(user, tool, args, key, *a, **kw)
        if tool == "issue_refund":
            raise DiesInTheRefund
        return out

    backend.call = dies  # type: ignore[method-assign]
    stranded: TurnMessage | None = None
    for _ in range(10):
        inproc.cycle()
        for msg in inproc.take():
            try:
                inproc.runner.run(msg)
            except DiesInTheRefund:
                stranded = msg
        if stranded:
            break
    assert stranded is not None
    rec = inproc.load("globex", tid)
    assert rec.state is S.WAITING_TOOL, "the refund was registered before it was sent"
    backend.call = real_call  # type: ignore[method-assign]
    report = inproc.runner.run(stranded, redelivered=True)  # its version is stale now
    assert "stale version" in report.reason and inproc.load("globex", tid) == rec
    clock = ManualClock()
    sweep = StrandedTurns.over(
        inproc.api, ("globex",), custody=None, after_s=5.0, slow_after_s=600.0, clock=clock
    )
    for now in (0.0, 6.0, 12.0):  # first seen; version noted; still there: stranded
        clock.set(now)
        recovered = sweep.sweep()
    assert recovered == [tid]
    sent = inproc.take()  # the lookup the recovery asks for goes to a worker
    assert [type(c).__name__ for m in sent for c in m.commands] == ["LookupEffect"]
    for msg in sent:
        inproc.runner.run(msg)
    inproc.run_until_quiet()
    assert inproc.load("globex", tid).stop_reason is StopReason.DONE
    effects = Counter(tuple(e) for e in inproc.state.effects())
    assert effects == {("refund", oid, 3000): 1, ("email", oid): 1}


def test_an_approval_decided_at_the_router_sends_the_admitted_dispatch_to_a_worker(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 700, 1, total=9000)[0]
    job = {**refund_job(oid), "goal": f"refund 6000 cents on order {oid}"}  # limit: 5000
    tid = inproc.api.submit("acme", job).trajectory_id
    inproc.run_until_quiet()
    rec = inproc.load("acme", tid)
    assert rec.state is S.AWAITING_APPROVAL and rec.held is not None
    held = rec.held
    inproc.api.decide(
        "acme",
        tid,
        approval_id=held.approval_id,
        held_version=held.held_version,
        digest=held.digest,
        reviewer="reviewer",
        approve=True,
    )
    sent = inproc.take()
    assert len(sent) == 1 and isinstance(sent[0].commands[0], DispatchTool)
    inproc.runner.run(sent[0])
    inproc.run_until_quiet()
    assert inproc.load("acme", tid).stop_reason is StopReason.DONE
    assert ["refund", oid, 6000] in inproc.state.effects()


def test_a_turn_whose_message_was_lost_is_recovered_by_the_router_sweep(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 800, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    lost = one_turn_message(inproc)  # admitted and sent; the worker died holding it
    clock = ManualClock()
    sweep = StrandedTurns.over(
        inproc.api,
        ("acme", "globex", "initech"),
        custody=None,
        after_s=10.0,
        slow_after_s=600.0,
        clock=clock,
    )
    assert sweep.sweep() == []  # first seen now
    clock.set(11.0)
    assert sweep.sweep() == []  # old enough: its version is noted, and watched again
    assert inproc.load("initech", tid).record_version == lost.version
    clock.set(22.0)
    assert sweep.sweep() == [tid], "still at the same version after the bound: stranded"
    rec = inproc.load("initech", tid)
    assert rec.state is S.READY and rec.operations[lost.call_id].status is OpStatus.UNKNOWN
    assert inproc.runner.run(lost).outcome is NoticeKind.IDLE, "the lost message, if it shows up"
    inproc.run_until_quiet()
    assert inproc.load("initech", tid).stop_reason is StopReason.DONE
