"""Streaming cancellation, shown causally (seed 004 section 10.5.1).

The server streams a 4,096-token reply slowly: a complete ``issue_refund`` call first, then a
long second call. The operator's cancel reaches the kernel only once the client has received
the complete refund call; the kernel emits ``CancelCall``; the worker carries it out by setting
the call's cancel token; the provider shuts its socket down at once. The server records that
the client went away before the last token, the reply is CANCELED, and nothing is dispatched,
although a complete, valid refund call had streamed.
"""

from __future__ import annotations

import json
import queue
import threading

from kernel.budget import Budget
from kernel.events import CancelCall, ControlRequested, ReplyStatus
from kernel.record import ControlKind, OpStatus
from kernel.states import LifecycleState, StopReason
from tests.providers.conftest import Serve
from tests.providers.fake_openai import deltas
from tests.providers.fake_replies import Reply
from tests.providers.scripts import KernelTurns
from worker.models import Model, ModelReply
from worker.providers import CancelToken, InFlightCalls, OpenAICompatible
from worker.providers.openai_compat import Observer
from worker.providers.stream import Accumulator

TOKENS = 4096
BUDGET = Budget(max_output_tokens=TOKENS, max_tokens=20_000)
REFUND = json.dumps({"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"})


def long_reply(delay_s: float) -> Reply:
    """Exactly 4,096 streamed tokens; the refund call is complete after the first few."""
    base = Reply(tool_calls=[("issue_refund", REFUND), ("send_status_email", "")])
    tail_tokens = TOKENS - len(deltas(base))
    empty = json.dumps({"order_id": "ord_1001", "note": ""})
    tail = json.dumps({"order_id": "ord_1001", "note": "x" * (4 * tail_tokens - len(empty))})
    reply = Reply(
        tool_calls=[("issue_refund", REFUND), ("send_status_email", tail)], delay_s=delay_s
    )
    assert len(deltas(reply)) == TOKENS
    return reply


def refund_call_streamed(done: threading.Event) -> Observer:
    """An observer that says when the first tool call has streamed in full."""

    def observe(acc: Accumulator) -> None:
        if acc.closed_tool_calls() >= 1:  # the refund call is complete: the next one began
            done.set()

    return observe


def in_thread(
    model: Model, view: str, cap: int, timeout: float, token: CancelToken
) -> queue.Queue[ModelReply]:
    """Run the call as a worker thread would; its reply arrives on the queue."""
    replies: queue.Queue[ModelReply] = queue.Queue()

    def work() -> None:
        replies.put(model.call(view, cap, timeout, cancel=token))

    threading.Thread(target=work, name="model-call").start()
    return replies


def test_operator_cancel_in_mid_stream_dispatches_nothing(serve: Serve) -> None:
    server = serve([long_reply(delay_s=0.005)])
    k = KernelTurns(budget=BUDGET)
    cmd = k.admit()
    calls_in_flight = InFlightCalls()
    token = calls_in_flight.open(cmd.call_id)
    refund_streamed = threading.Event()
    model = OpenAICompatible(
        base_url=server.base_url,
        model="refund-policy",
        tools=list(k.ctx.agent.catalog.tools.values()),
        observer=refund_call_streamed(refund_streamed),
    )
    replies = in_thread(model, cmd.view, cmd.max_output_tokens, cmd.timeout_s, token)

    assert refund_streamed.wait(30), "the refund call never streamed"
    control = k.apply(
        ControlRequested(
            now=0.5, kind=ControlKind.CANCEL, request_id="op-1", requested_by="operator"
        )
    )
    cancels = [c for c in control.commands if isinstance(c, CancelCall)]
    assert [c.call_id for c in cancels] == [cmd.call_id]
    for c in cancels:  # the worker carries the command out
        assert calls_in_flight.cancel(c.call_id)

    reply = replies.get(timeout=30)
    calls_in_flight.close(cmd.call_id)
    assert reply.status is ReplyStatus.CANCELED
    assert reply.content is None and reply.usage is None
    assert reply.partial is not None and f"issue_refund({REFUND})" in reply.partial

    seen = server.seen[0]
    assert seen.closed.wait(30)
    assert seen.planned_tokens == TOKENS
    assert seen.disconnected and not seen.finished
    assert seen.sent_tokens < TOKENS  # the disconnect came before the last token

    folded = k.reply(cmd, reply, now=1.0)
    assert folded.quarantined is not None  # kept as diagnostics, never a proposal
    assert k.dispatches == [] and k.rec.tool_dispatches == 0
    op = k.rec.operations[cmd.call_id]
    assert op.evidence is not None and op.evidence["status"] == "CANCELED"
    assert op.evidence.get("quarantined") and "issue_refund" in op.evidence["raw"]
    model_rows = [r for r in folded.rows if r.kind.value == "model"]
    assert [(r.outcome, (r.detail or {}).get("proposal")) for r in model_rows] == [
        ("CANCELED", None)
    ]
    # No usage evidence: the reservation stays, owned by the reconciler (settlement rule).
    assert cmd.attempt_id in k.rec.ledger.reservations
    assert op.status in (OpStatus.UNKNOWN, OpStatus.HANDED_OFF)
    assert k.rec.state is LifecycleState.CANCELED
    assert k.rec.stop_reason is StopReason.CANCELED


def test_the_same_stream_not_canceled_would_have_been_dispatched(serve: Serve) -> None:
    """The control case: the same 4,096 tokens, streamed to the end, are a valid proposal."""
    server = serve([long_reply(delay_s=0.0)])
    k = KernelTurns(budget=BUDGET)
    cmd = k.admit()
    model = OpenAICompatible(
        base_url=server.base_url,
        model="refund-policy",
        tools=list(k.ctx.agent.catalog.tools.values()),
    )
    reply = model.call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.usage is not None and reply.usage.output == TOKENS
    assert server.seen[0].finished and server.seen[0].sent_tokens == TOKENS
    k.reply(cmd, reply)
    assert [d.tool for d in k.dispatches] == ["issue_refund", "send_status_email"]


def test_a_call_canceled_by_its_worker_is_observed_not_dispatched(serve: Serve) -> None:
    """A worker that drains cancels its own in-flight stream; the call is still eligible, so
    the kernel observes ``reply_canceled`` and goes back to READY; nothing is dispatched."""
    server = serve([long_reply(delay_s=0.005)])
    k = KernelTurns(budget=BUDGET)
    cmd = k.admit()
    token = CancelToken()
    refund_streamed = threading.Event()
    model = OpenAICompatible(
        base_url=server.base_url,
        model="refund-policy",
        tools=list(k.ctx.agent.catalog.tools.values()),
        observer=refund_call_streamed(refund_streamed),
    )
    replies = in_thread(model, cmd.view, cmd.max_output_tokens, cmd.timeout_s, token)
    assert refund_streamed.wait(30)
    token.set()
    reply = replies.get(timeout=30)
    assert reply.status is ReplyStatus.CANCELED
    assert server.seen[0].closed.wait(30) and server.seen[0].disconnected
    folded = k.reply(cmd, reply, now=1.0)
    assert folded.quarantined is None
    assert k.rec.state is LifecycleState.READY and k.dispatches == []
    assert k.rec.last_observation == {"status": "error", "code": "reply_canceled"}


def test_a_token_set_before_the_call_sends_nothing(serve: Serve) -> None:
    server = serve([Reply(content="{}")])
    token = CancelToken()
    token.set()
    model = OpenAICompatible(base_url=server.base_url, model="m")
    assert model.call("{}", 10, 5.0, cancel=token).status is ReplyStatus.CANCELED
    assert server.seen == []


def test_cancel_token_runs_callbacks_once_and_late_ones_at_once() -> None:
    token = CancelToken()
    ran: list[str] = []
    unregister = token.on_cancel(lambda: ran.append("a"))
    token.on_cancel(lambda: ran.append("b"))()  # registered, then unregistered
    token.set()
    token.set()
    token.on_cancel(lambda: ran.append("late"))
    unregister()
    assert ran == ["a", "late"] and token.is_set()


def test_inflight_calls_cancel_only_what_is_in_flight() -> None:
    calls_in_flight = InFlightCalls()
    token = calls_in_flight.open("t1/m1")
    assert calls_in_flight.cancel("t1/m1") and token.is_set()
    calls_in_flight.close("t1/m1")
    assert not calls_in_flight.cancel("t1/m1") and len(calls_in_flight) == 0
