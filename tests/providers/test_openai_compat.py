"""The OpenAI-compatible provider against a real HTTP server on loopback.

Round trip with tool calling, streaming, usage with cached tokens settled at the cached price,
429 as REJECTED, and every bad input of the issue: each ends as a reply status or a recoverable
observation, never an exception and never a dispatch.
"""

from __future__ import annotations

import itertools
import json
import time
from decimal import Decimal
from typing import Any

import pytest

from examples.support_store import PRICE, make_agent
from examples.support_store.backend import SupportStoreBackend
from kernel.amounts import Usage, model_call_charge
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.events import ReplyStatus
from kernel.states import LifecycleState, StopReason
from tests.kernel.harness import new_record
from tests.providers.conftest import Serve
from tests.providers.fake_replies import Reply
from tests.providers.scripts import KernelTurns, view_of
from worker.embedded import EmbeddedRunner
from worker.providers import OpenAICompatible
from worker.providers.stream import Accumulator

TOOLS = list(make_agent().profile.catalog.tools.values())
FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})


def provider(base_url: str, **kw: Any) -> OpenAICompatible:
    return OpenAICompatible(base_url=base_url, model="refund-policy", tools=TOOLS, **kw)


def call(p: OpenAICompatible, view: str = '{"goal": "g"}', cap: int = 300) -> Any:
    return p.call(view, cap, 10.0)


# --- tool calling and streaming ---------------------------------------------------------------


def test_tool_calling_round_trip_through_the_kernel(serve: Serve) -> None:
    """Tools go out in OpenAI's format; a tool call comes back, is dispatched by the kernel,
    and its result is in the view of the next request."""
    server = serve(
        [
            Reply(tool_calls=[("get_order", json.dumps({"order_id": "ord_1001"}))]),
            Reply(content=FINAL),
        ]
    )
    agent = make_agent()
    backend = SupportStoreBackend()
    model = provider(server.base_url, api_key="sk-test")
    out = EmbeddedRunner(KernelContext(agent.profile), model, backend).run(new_record(Budget()))
    assert out.record.stop_reason is StopReason.DONE
    assert backend.calls == 1
    assert out.record.facts["ord_1001.total_cents"] == 4200

    first, second = (s.request for s in server.seen)
    assert server.seen[0].headers["authorization"] == "Bearer sk-test"
    assert first["model"] == "refund-policy" and first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert first["max_tokens"] == Budget().max_output_tokens
    exported = {t["function"]["name"]: t for t in first["tools"]}
    assert set(exported) == {"get_order", "search_policy", "issue_refund", "send_status_email"}
    refund = exported["issue_refund"]
    assert refund["type"] == "function"
    params = refund["function"]["parameters"]
    assert params["type"] == "object"
    assert set(params["required"]) == {"order_id", "amount_cents"}
    assert params["properties"]["amount_cents"]["exclusiveMinimum"] == 0
    assert "plan_step" in params["properties"]
    assert json.loads(view_of(second))["facts"]["ord_1001.total_cents"] == 4200


def test_plan_step_rides_as_an_argument_and_is_taken_out(serve: Serve) -> None:
    args = {"order_id": "ord_1001", "amount_cents": 3000, "plan_step": "s2"}
    server = serve([Reply(tool_calls=[("issue_refund", json.dumps(args))])])
    reply = call(provider(server.base_url))
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.content == {
        "type": "tool",
        "name": "issue_refund",
        "args": {"order_id": "ord_1001", "amount_cents": 3000},
        "plan_step": "s2",
    }


def test_several_tool_calls_become_one_batch(serve: Serve) -> None:
    calls = [("get_order", '{"order_id": "ord_1001"}'), ("get_order", '{"order_id": "ord_1002"}')]
    reply = call(provider(serve([Reply(tool_calls=calls)]).base_url))
    assert reply.content == {
        "type": "tools",
        "calls": [
            {"name": "get_order", "args": {"order_id": "ord_1001"}},
            {"name": "get_order", "args": {"order_id": "ord_1002"}},
        ],
    }


def test_streaming_reassembles_a_reply_sent_token_by_token(serve: Serve) -> None:
    plan = {"type": "plan", "steps": [{"id": "s1", "tool": "get_order", "depends_on": []}]}
    text = json.dumps(plan)
    server = serve([Reply(content=text)])
    seen: list[int] = []

    def observe(acc: Accumulator) -> None:
        seen.append(len("".join(acc.content)))

    reply = call(provider(server.base_url, observer=observe))
    assert server.seen[0].sent_tokens == (len(text) + 3) // 4 > 10
    assert seen == sorted(seen) and seen[0] < seen[-2] == len(text)  # grew chunk by chunk
    assert reply.status is ReplyStatus.COMPLETED and reply.content == plan and reply.raw == text
    assert reply.usage == Usage(uncached_input=4, output=server.seen[0].sent_tokens)


def test_a_server_that_ignores_stream_answers_whole(serve: Serve) -> None:
    whole = {
        "choices": [{"index": 0, "message": {"content": FINAL}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 5},
    }
    reply = call(provider(serve([Reply(body=json.dumps(whole))]).base_url))
    assert reply.status is ReplyStatus.COMPLETED and reply.content["type"] == "final"
    assert reply.usage == Usage(uncached_input=9, output=5)


# --- usage and settlement ----------------------------------------------------------------------


def test_cached_tokens_are_settled_at_the_cached_price(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, prompt_tokens=1000, cached_tokens=800)])
    k = KernelTurns()
    cmd = k.admit()
    reply = provider(server.base_url).call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    out_tokens = server.seen[0].sent_tokens
    assert reply.usage == Usage(uncached_input=200, cached_input=800, output=out_tokens)
    k.reply(cmd, reply)
    dollars = k.rec.ledger.dollars
    expected = (Decimal(3) * 200 + Decimal("0.30") * 800 + Decimal(15) * out_tokens) / 10**6
    assert dollars.actual == expected == model_call_charge(PRICE, reply.usage).dollars
    uncached = (Decimal(3) * 1000 + Decimal(15) * out_tokens) / 10**6
    assert dollars.actual < uncached  # the cache discount reached the ledger
    assert dollars.reserved == 0 and k.rec.ledger.tokens.actual == 1000 + out_tokens


# --- rate limits --------------------------------------------------------------------------------


def test_429_is_rejected_with_its_retry_after_and_never_slept_on(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"the provider slept {seconds}s")

    monkeypatch.setattr(time, "sleep", no_sleep)
    headers = {
        "retry-after": "20",
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "20s",
    }
    body = json.dumps({"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}})
    server = serve([Reply(status=429, headers=headers, body=body)])
    k = KernelTurns()
    cmd = k.admit()
    reply = provider(server.base_url).call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    assert reply.status is ReplyStatus.REJECTED and reply.retry_after_s == 20.0
    assert reply.rate_limits == headers and "rate_limit_exceeded" in (reply.detail or "")
    assert reply.usage is None
    k.reply(cmd, reply)
    assert k.rec.state is LifecycleState.READY and not k.dispatches
    # the provider's capacity, not the agent's error: the model is not told, nothing counts
    assert k.rec.last_observation is None and k.rec.error_streak.count == 0
    assert k.rec.rejections == 1


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500", "retry-after": "2"}, 1.5),
        ({"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-reset-tokens": "120ms"}, 360.0),
        ({}, None),
    ],
)
def test_retry_after_is_read_from_the_headers_a_429_carries(
    serve: Serve, headers: dict[str, str], expected: float | None
) -> None:
    reply = call(provider(serve([Reply(status=429, headers=headers)]).base_url))
    assert reply.status is ReplyStatus.REJECTED and reply.retry_after_s == expected


# --- bad input: a status or an observation, never an exception, never a dispatch --------------

CUT = Reply(content=FINAL, cut_after=3)
NOT_NOW = "not now"  # a refusal for capacity (kernel.backpressure), not an observation
CASES: dict[str, tuple[Reply, ReplyStatus, str]] = {
    "malformed JSON chunk": (Reply(events=["{not json"]), ReplyStatus.FAULTED, "reply_faulted"),
    "200 with an error body": (
        Reply(body=json.dumps({"error": {"message": "model overloaded"}})),
        ReplyStatus.FAULTED,
        "reply_faulted",
    ),
    "200 with an HTML page": (
        Reply(body="<html>Bad gateway</html>", headers={"Content-Type": "text/html"}),
        ReplyStatus.FAULTED,
        "reply_faulted",
    ),
    "error event in the stream": (
        Reply(events=[json.dumps({"error": {"message": "internal"}})]),
        ReplyStatus.FAULTED,
        "reply_faulted",
    ),
    "empty stream": (
        Reply(events=[], done=False),
        ReplyStatus.TRANSPORT_FAILURE,
        "reply_transport_failure",
    ),
    "cut stream": (CUT, ReplyStatus.TRANSPORT_FAILURE, "reply_transport_failure"),
    "done without a reply": (Reply(events=[]), ReplyStatus.FAULTED, "reply_faulted"),
    "unknown finish reason": (
        Reply(content=FINAL, finish_reason="abort"),
        ReplyStatus.FAULTED,
        "reply_faulted",
    ),
    "cut at the output cap": (
        Reply(content="x" * 4000),
        ReplyStatus.TRUNCATED,
        "reply_truncated",
    ),
    "content filter": (
        Reply(content=FINAL, finish_reason="content_filter"),
        ReplyStatus.REFUSED,
        "reply_refused",
    ),
    "refusal": (Reply(refusal="I can't help with that."), ReplyStatus.REFUSED, "reply_refused"),
    "HTTP 500": (Reply(status=500), ReplyStatus.TRANSPORT_FAILURE, "reply_transport_failure"),
    "HTTP 503": (Reply(status=503), ReplyStatus.REJECTED, NOT_NOW),
    "HTTP 401": (Reply(status=401), ReplyStatus.FAULTED, "reply_faulted"),
    "HTTP 400 content policy": (
        Reply(status=400, body=json.dumps({"error": {"code": "content_filter"}})),
        ReplyStatus.REFUSED,
        "reply_refused",
    ),
    "prose instead of JSON": (Reply(content="Sure! I'll refund it."), ReplyStatus.COMPLETED, "m"),
    "unknown tool": (
        Reply(tool_calls=[("drop_tables", "{}")]),
        ReplyStatus.COMPLETED,
        "unknown_tool",
    ),
    "malformed tool arguments": (
        Reply(tool_calls=[("issue_refund", '{"order_id": "ord_1001", "amount_cents": 30')]),
        ReplyStatus.COMPLETED,
        "schema_violation",
    ),
    "arguments that fail the schema": (
        Reply(tool_calls=[("issue_refund", '{"order_id": "ord_1001", "amount_cents": -5}')]),
        ReplyStatus.COMPLETED,
        "schema_violation",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_becomes_a_status_or_an_observation(serve: Serve, case: str) -> None:
    scripted, status, code = CASES[case]
    server = serve([scripted])
    k = KernelTurns()
    cmd = k.admit()
    reply = provider(server.base_url).call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    assert reply.status is status, reply
    k.reply(cmd, reply)
    assert not k.dispatches
    assert k.rec.state is LifecycleState.READY
    if code == NOT_NOW:  # backpressure: asked again later, the model is not told
        assert k.rec.last_observation is None and k.rec.rejections == 1
        return
    observed = (k.rec.last_observation or {}).get("code", "")
    assert observed.startswith(code if code != "m" else "malformed_reply"), observed


def test_malformed_tool_arguments_pass_as_text_and_are_observed(serve: Serve) -> None:
    broken = '{"order_id": "ord_1001", "amount_cents": 30'
    server = serve([Reply(tool_calls=[("issue_refund", broken)])])
    k = KernelTurns()
    cmd = k.admit()
    reply = provider(server.base_url).call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    assert reply.content == {"type": "tool", "name": "issue_refund", "args": broken}
    k.reply(cmd, reply)
    assert k.rec.last_observation == {
        "status": "error",
        "code": "schema_violation",
        "detail": "issue_refund: arguments must be an object",
    }
    assert not k.dispatches and k.rec.tool_dispatches == 0


def test_cut_stream_keeps_what_streamed_for_diagnosis_only(serve: Serve) -> None:
    reply = call(provider(serve([CUT]).base_url))
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and not reply.timed_out
    assert reply.content is None and reply.partial == FINAL[:12]


def test_no_server_is_a_transport_failure(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    url = server.base_url
    server.stop()
    reply = call(provider(url))
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and "transport" in (reply.detail or "")


def test_the_deadline_bounds_every_wait(serve: Serve) -> None:
    """A server slower than what is left of the deadline: the read gives up, timed out."""
    server = serve([Reply(content=FINAL, delay_s=30.0)])
    reply = provider(server.base_url).call('{"goal": "g"}', 300, 1.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.timed_out
    assert reply.partial == FINAL[:4]  # the first token came; the next one never did
    assert server.seen[0].closed.wait(30) and server.seen[0].disconnected


def test_a_spent_deadline_sends_nothing(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    reply = provider(server.base_url).call('{"goal": "g"}', 300, 0.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.timed_out
    assert server.seen == []


def test_reported_latency_comes_from_the_named_header(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, latency_ms=1500), Reply(content=FINAL, latency_ms=1500)])
    assert call(provider(server.base_url, latency_header="openai-processing-ms")).latency_s == 1.5
    ticks = itertools.chain([100.0], itertools.repeat(100.25))
    measured = call(provider(server.base_url, clock=lambda: next(ticks)))
    assert measured.latency_s == 0.25  # by default: the (injected) clock's measure
