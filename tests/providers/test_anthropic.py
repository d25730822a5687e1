"""What is Anthropic's own in the Messages provider (the shared contract is test_contract.py):
the request it sends, cache reads and writes in usage, 529 and overloaded errors in the stream
as REJECTED, the ``anthropic-ratelimit-*`` headers reaching the gates, and the stream's events
it must tolerate or refuse."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest

from examples.support_store import make_agent
from kernel.amounts import ModelPrice, Usage, model_call_charge
from kernel.events import ReplyStatus
from router.admission.feedback import feedback_from
from tests.providers.conftest import Serve
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from worker.providers import AnthropicMessages, ProviderConfigError, make_model, with_model

TOOLS = list(make_agent().profile.catalog.tools.values())
FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})


def provider(server: FakeProvider, base: str | None = None, **kw: object) -> AnthropicMessages:
    return AnthropicMessages(
        base_url=base or server.root_url,
        model="claude-test",
        tools=TOOLS,
        **kw,  # type: ignore[arg-type]
    )


def event(kind: str, **fields: object) -> str:
    return json.dumps({"type": kind, **fields})


START = event(
    "message_start",
    message={"id": "m", "type": "message", "role": "assistant", "content": [],
             "usage": {"input_tokens": 10, "output_tokens": 1}},
)  # fmt: skip


def test_the_request_is_a_streamed_messages_call(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    reply = provider(server, api_key="sk-ant").call('{"goal": "g"}', 256, 10.0)
    assert reply.status is ReplyStatus.COMPLETED
    seen = server.seen[0]
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == "sk-ant"
    assert seen.headers["anthropic-version"] == "2023-06-01"
    body = seen.request
    assert body["model"] == "claude-test" and body["max_tokens"] == 256 and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": '{"goal": "g"}'}]
    assert "reins agent" in body["system"]
    tools = {t["name"]: t for t in body["tools"]}
    assert set(tools) == {"get_order", "search_policy", "issue_refund", "send_status_email"}
    schema = tools["issue_refund"]["input_schema"]
    assert schema["type"] == "object" and "plan_step" in schema["properties"]


def test_a_base_url_with_v1_is_taken_as_it_is(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    assert provider(server, base=server.base_url).call("{}", 50, 10.0).status.value == "COMPLETED"
    assert server.seen[0].path == "/v1/messages"


def test_cache_reads_and_writes_are_usage_of_their_own(serve: Serve) -> None:
    server = serve(
        [Reply(content=FINAL, prompt_tokens=40, cached_tokens=900, cache_write_tokens=60)]
    )
    reply = provider(server).call("{}", 300, 10.0)
    out = server.seen[0].sent_tokens
    assert reply.usage == Usage(
        uncached_input=40, cached_input=900, cache_write_input=60, output=out
    )
    price = ModelPrice(
        input_per_m=Decimal(3),
        cached_input_per_m=Decimal("0.30"),
        cache_write_input_per_m=Decimal("3.75"),
        output_per_m=Decimal(15),
    )
    expected = (Decimal(3) * 40 + Decimal("0.30") * 900 + Decimal("3.75") * 60 + 15 * out) / 10**6
    assert model_call_charge(price, reply.usage).dollars == expected


@pytest.mark.parametrize("status", [429, 529, 503])
def test_rate_limited_and_overloaded_are_rejected(serve: Serve, status: int) -> None:
    server = serve([Reply(status=status, headers={"retry-after": "7"})])
    reply = provider(server).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.REJECTED and reply.retry_after_s == 7.0
    assert reply.usage is None


def test_an_overloaded_error_in_the_stream_is_rejected(serve: Serve) -> None:
    overloaded = event("error", error={"type": "overloaded_error", "message": "Overloaded"})
    reply = provider(serve([Reply(events=[START, overloaded], done=False)])).call("{}", 9, 9.0)
    assert reply.status is ReplyStatus.REJECTED and "Overloaded" in (reply.detail or "")


def test_another_error_in_the_stream_is_faulted(serve: Serve) -> None:
    failed = event("error", error={"type": "api_error", "message": "Internal"})
    reply = provider(serve([Reply(events=[START, failed], done=False)])).call("{}", 9, 9.0)
    assert reply.status is ReplyStatus.FAULTED and "Internal" in (reply.detail or "")


def test_the_rate_limit_headers_reach_the_gates_feedback(serve: Serve) -> None:
    reset = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 30))
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "3",
        "anthropic-ratelimit-requests-reset": reset,
        "anthropic-ratelimit-input-tokens-remaining": "9000",
        "anthropic-ratelimit-output-tokens-remaining": "2000",
        "anthropic-ratelimit-tokens-reset": reset,
        "request-id": "req_1",
    }
    reply = provider(serve([Reply(content=FINAL, headers=headers)])).call("{}", 300, 10.0)
    assert "request-id" not in reply.rate_limits
    assert reply.rate_limits["anthropic-ratelimit-requests-remaining"] == "3"
    fed = feedback_from(reply.rate_limits, reply.retry_after_s, time.time())
    assert fed.remaining_requests == 3 and fed.remaining_tokens == 2000
    assert fed.reset_s is not None and 25 < fed.reset_s <= 30


def test_unknown_events_and_pings_are_skipped(serve: Serve) -> None:
    events = [
        START,
        event("ping"),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("some_future_event", detail=1),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": FINAL}),
        event("content_block_stop", index=0),
        event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 5}),
        event("message_stop"),
    ]
    reply = provider(serve([Reply(events=events)])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.COMPLETED and reply.content == json.loads(FINAL)
    assert reply.usage == Usage(uncached_input=10, output=5)


def test_a_delta_for_a_block_never_started_is_faulted(serve: Serve) -> None:
    events = [
        START,
        event("content_block_delta", index=3, delta={"type": "text_delta", "text": "x"}),
    ]
    reply = provider(serve([Reply(events=events)])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.FAULTED and "never started" in (reply.detail or "")
    assert reply.raw is not None and "content_block_delta" in reply.raw


def test_an_unknown_stop_reason_is_faulted(serve: Serve) -> None:
    reply = provider(serve([Reply(content=FINAL, finish_reason="pause_turn")])).call("{}", 300, 9.0)
    assert reply.status is ReplyStatus.FAULTED and "pause_turn" in (reply.detail or "")


def test_a_whole_message_is_read_like_a_stream(serve: Serve) -> None:
    whole = {
        "type": "message",
        "content": [
            {"type": "tool_use", "id": "t", "name": "get_order", "input": {"order_id": "o1"}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 3},
    }
    reply = provider(serve([Reply(body=json.dumps(whole))])).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.COMPLETED
    assert reply.content == {"type": "tool", "name": "get_order", "args": {"order_id": "o1"}}
    assert reply.usage == Usage(uncached_input=12, cached_input=3, output=7)


def test_a_profile_names_the_anthropic_provider_and_its_key_variable(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    agent = make_agent()
    profile = with_model(
        agent.profile, provider="anthropic", base_url=server.root_url, api_key_env="ANT_KEY"
    )
    model = make_model(profile, agent.make_policy("g"), {"ANT_KEY": "sk-ant-1"})
    assert isinstance(model, AnthropicMessages)
    assert model.call("{}", 300, 10.0).status is ReplyStatus.COMPLETED
    assert server.seen[0].headers["x-api-key"] == "sk-ant-1"
    with pytest.raises(ProviderConfigError, match="ANT_KEY is not set") as refused:
        make_model(profile, agent.make_policy("g"), {})
    assert "sk-ant" not in str(refused.value)
