"""The provider contract, run against both protocols on the loopback server.

Each test runs once for OpenAI's chat completions and once for Anthropic's Messages, the same
scripted answer encoded by each: text, tool calls, a streaming cancel in mid-reply whose reply
is quarantined, a 429 with retry-after, usage reported past what streamed, a cut stream, a slow
reply, an answer that does not parse. Whatever the far side does ends as a reply status or an
observation, never an exception and never a dispatch.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from examples.support_store import PRICE, make_agent
from kernel.amounts import Usage, model_call_charge
from kernel.budget import Budget
from kernel.events import CancelCall, ControlRequested, ReplyStatus
from kernel.record import ControlKind
from kernel.states import LifecycleState, StopReason
from tests.providers.conftest import Serve
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from tests.providers.scripts import KernelTurns
from worker.models import ModelReply
from worker.providers import AnthropicMessages, CancelToken, InFlightCalls, OpenAICompatible
from worker.providers.streaming import Folding, StreamedProvider

TOOLS = list(make_agent().profile.catalog.tools.values())
FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})
REFUND = json.dumps({"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"})
PROTOCOLS = ("openai", "anthropic")
RATE_LIMITS = {
    "openai": {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"},
    "anthropic": {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2030-01-01T00:00:00Z",
    },
}

Make = Callable[..., StreamedProvider]


@pytest.fixture(params=PROTOCOLS)
def protocol(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(protocol: str) -> Make:
    """A provider of the protocol under test for a loopback server."""

    def build(server: FakeProvider, **kw: Any) -> StreamedProvider:
        kw.setdefault("tools", TOOLS)
        if protocol == "openai":
            return OpenAICompatible(base_url=server.base_url, model="refund-policy", **kw)
        return AnthropicMessages(base_url=server.root_url, model="refund-policy", **kw)

    return build


def turn(p: StreamedProvider, k: KernelTurns) -> tuple[Any, ModelReply]:
    cmd = k.admit()
    return cmd, p.call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)


# --- text and tool calls --------------------------------------------------------------------


def test_text_is_a_completed_reply_with_its_usage(serve: Serve, make: Make) -> None:
    server = serve([Reply(content=FINAL, prompt_tokens=321)])
    reply = make(server).call('{"goal": "g"}', 300, 10.0)
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.content == json.loads(FINAL) and reply.raw == FINAL
    assert reply.usage == Usage(uncached_input=321, output=server.seen[0].sent_tokens)
    assert server.seen[0].finished


def test_a_tool_call_is_a_proposal_the_kernel_dispatches(serve: Serve, make: Make) -> None:
    args = {"order_id": "ord_1001", "plan_step": "s1"}
    server = serve([Reply(tool_calls=[("get_order", json.dumps(args))])])
    k = KernelTurns()
    cmd, reply = turn(make(server), k)
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.content == {
        "type": "tool",
        "name": "get_order",
        "args": {"order_id": "ord_1001"},
        "plan_step": "s1",
    }
    k.reply(cmd, reply)
    assert [(d.tool, d.args) for d in k.dispatches] == [("get_order", {"order_id": "ord_1001"})]


def test_several_tool_calls_are_one_batch(serve: Serve, make: Make) -> None:
    calls = [("get_order", '{"order_id": "ord_1001"}'), ("get_order", '{"order_id": "ord_1002"}')]
    reply = make(serve([Reply(tool_calls=calls)])).call("{}", 300, 10.0)
    assert reply.content == {
        "type": "tools",
        "calls": [
            {"name": "get_order", "args": {"order_id": "ord_1001"}},
            {"name": "get_order", "args": {"order_id": "ord_1002"}},
        ],
    }


# --- streaming cancel, quarantined ----------------------------------------------------------


def test_a_cancel_in_mid_reply_is_quarantined_and_dispatches_nothing(
    serve: Serve, make: Make
) -> None:
    """The refund call streams in full, then the operator cancels: the kernel emits
    CancelCall, the worker sets the token, the socket closes before the last token, the reply
    is CANCELED and kept as diagnostics only, and nothing is dispatched."""
    long_tail = json.dumps({"order_id": "ord_1001", "note": "x" * 8000})
    server = serve(
        [
            Reply(
                tool_calls=[("issue_refund", REFUND), ("send_status_email", long_tail)],
                delay_s=0.005,
            )
        ]
    )
    k = KernelTurns(budget=Budget(max_output_tokens=4096, max_tokens=20_000))
    cmd = k.admit()
    in_flight = InFlightCalls()
    token = in_flight.open(cmd.call_id)
    refund_streamed = threading.Event()

    def observe(acc: Folding) -> None:
        if acc.closed_tool_calls() >= 1:
            refund_streamed.set()

    p = make(server, observer=observe)
    replies: list[ModelReply] = []
    worker = threading.Thread(
        target=lambda: replies.append(
            p.call(cmd.view, cmd.max_output_tokens, cmd.timeout_s, cancel=token)
        )
    )
    worker.start()
    assert refund_streamed.wait(30), "the refund call never streamed"
    control = k.apply(
        ControlRequested(
            now=0.5, kind=ControlKind.CANCEL, request_id="op-1", requested_by="operator"
        )
    )
    cancels = [c.call_id for c in control.commands if isinstance(c, CancelCall)]
    assert cancels == [cmd.call_id] and in_flight.cancel(cmd.call_id)
    worker.join(30)
    (reply,) = replies
    assert reply.status is ReplyStatus.CANCELED and reply.content is None
    assert reply.partial is not None and "issue_refund" in reply.partial
    seen = server.seen[0]
    assert seen.closed.wait(30) and seen.disconnected and not seen.finished
    assert seen.sent_tokens < seen.planned_tokens
    folded = k.reply(cmd, reply)
    assert folded.quarantined is not None  # diagnostics, never a proposal
    assert k.dispatches == [] and k.rec.tool_dispatches == 0
    evidence = k.rec.operations[cmd.call_id].evidence or {}
    assert evidence.get("quarantined") and "issue_refund" in evidence["raw"]
    assert k.rec.stop_reason is StopReason.CANCELED


def test_a_token_set_before_the_call_sends_nothing(serve: Serve, make: Make) -> None:
    server = serve([Reply(content=FINAL)])
    token = CancelToken()
    token.set()
    assert make(server).call("{}", 10, 5.0, cancel=token).status is ReplyStatus.CANCELED
    assert server.seen == []


# --- rate limits ----------------------------------------------------------------------------


def test_429_is_rejected_with_its_retry_after_and_headers(
    serve: Serve, make: Make, protocol: str
) -> None:
    headers = {"retry-after": "20", **RATE_LIMITS[protocol]}
    server = serve([Reply(status=429, headers=headers)])
    k = KernelTurns()
    cmd, reply = turn(make(server), k)
    assert reply.status is ReplyStatus.REJECTED and reply.retry_after_s == 20.0
    assert reply.rate_limits == headers and reply.usage is None
    k.reply(cmd, reply)
    assert k.rec.state is LifecycleState.READY and not k.dispatches
    # the provider's capacity, not the agent's error: the model is not told, nothing counts,
    # and the record names what it waits for
    assert k.rec.last_observation is None and k.rec.error_streak.count == 0
    assert k.rec.rejections == 1 and k.rec.rejected_by is not None


def test_a_429_without_retry_after_waits_for_the_latest_reset(
    serve: Serve, make: Make, protocol: str
) -> None:
    reply = make(serve([Reply(status=429, headers=RATE_LIMITS[protocol])])).call("{}", 10, 5.0)
    assert reply.status is ReplyStatus.REJECTED
    assert reply.retry_after_s is not None and reply.retry_after_s >= 20.0


# --- usage the provider over-reports ----------------------------------------------------------


def test_over_reported_usage_is_booked_as_reported_and_shown_as_an_overrun(
    serve: Serve, make: Make
) -> None:
    """The provider bills what it reports, whatever streamed: the ledger books it in full,
    past the reservation, and the chain row says by how much. Nothing is clipped."""
    server = serve([Reply(content=FINAL, prompt_tokens=90_000, completion_tokens=50_000)])
    k = KernelTurns(budget=Budget(max_tokens=1_000_000))
    cmd, reply = turn(make(server), k)
    assert reply.usage == Usage(uncached_input=90_000, output=50_000)
    assert server.seen[0].sent_tokens < 50_000 > cmd.max_output_tokens
    result = k.reply(cmd, reply)
    charge = model_call_charge(PRICE, reply.usage)
    assert k.rec.ledger.tokens.actual == 140_000 and k.rec.ledger.dollars.actual == charge.dollars
    assert k.rec.ledger.overrun.tokens > 0 and k.rec.ledger.overrun.dollars > Decimal(0)
    row = next(r for r in result.rows if r.kind.value == "model")
    assert row.detail is not None and row.detail["overrun"]["tokens"] == k.rec.ledger.overrun.tokens


# --- broken answers -------------------------------------------------------------------------


def test_a_cut_stream_is_a_transport_failure_with_its_partial(serve: Serve, make: Make) -> None:
    server = serve([Reply(content=FINAL, cut_after=3)])
    k = KernelTurns()
    cmd, reply = turn(make(server), k)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and not reply.timed_out
    assert reply.content is None and reply.partial == FINAL[:12]
    k.reply(cmd, reply)
    assert k.rec.state is LifecycleState.READY and not k.dispatches
    assert (k.rec.last_observation or {}).get("code") == "reply_transport_failure"


def test_a_stream_ended_without_its_end_marker_is_cut(serve: Serve, make: Make) -> None:
    reply = make(serve([Reply(content=FINAL, done=False)])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.content is None


def test_a_slow_reply_runs_out_of_its_deadline(serve: Serve, make: Make) -> None:
    server = serve([Reply(content=FINAL, delay_s=30.0)])
    reply = make(server).call("{}", 300, 1.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.timed_out
    assert reply.partial == FINAL[:4]  # the first token came; the next one never did
    assert server.seen[0].closed.wait(30) and server.seen[0].disconnected


def test_an_answer_that_does_not_parse_is_faulted_with_its_first_bytes(
    serve: Serve, make: Make
) -> None:
    server = serve([Reply(events=["{not json at all"])])
    k = KernelTurns()
    cmd, reply = turn(make(server), k)
    assert reply.status is ReplyStatus.FAULTED
    assert reply.raw is not None and "{not json at all" in reply.raw  # kept for diagnosis
    k.reply(cmd, reply)
    assert k.rec.state is LifecycleState.READY and not k.dispatches
    assert k.rec.operations[cmd.call_id].evidence == {"status": "FAULTED", "raw": reply.raw}


def test_an_html_page_is_faulted_with_its_first_bytes(serve: Serve, make: Make) -> None:
    page = "<html><body>502 Bad gateway</body></html>"
    server = serve([Reply(body=page, headers={"Content-Type": "text/html"})])
    reply = make(server).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.FAULTED and reply.raw == page


def test_the_output_cap_truncates(serve: Serve, make: Make) -> None:
    reply = make(serve([Reply(content="x" * 4000)])).call("{}", 10, 10.0)
    assert reply.status is ReplyStatus.TRUNCATED and reply.content is None
    assert reply.raw == "x" * 40


def test_a_refusal_is_refused(serve: Serve, make: Make) -> None:
    reply = make(serve([Reply(refusal="I can't help with that.")])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.REFUSED and reply.content is None


def test_a_server_error_is_a_transport_failure(serve: Serve, make: Make) -> None:
    reply = make(serve([Reply(status=500)])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and "HTTP 500" in (reply.detail or "")


def test_a_bad_key_is_faulted(serve: Serve, make: Make) -> None:
    reply = make(serve([Reply(status=401)])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.FAULTED and "HTTP 401" in (reply.detail or "")


def test_the_key_is_sent_and_never_shown(serve: Serve, make: Make, protocol: str) -> None:
    server = serve([Reply(content=FINAL)])
    p = make(server, api_key="sk-secret-123")
    p.call("{}", 300, 10.0)
    sent = server.seen[0].headers
    if protocol == "openai":
        assert sent["authorization"] == "Bearer sk-secret-123"
    else:
        assert sent["x-api-key"] == "sk-secret-123"
    assert "sk-secret-123" not in repr(p) and "sk-secret-123" not in str(vars(p).get("base_url"))
