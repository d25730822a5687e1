"""The official SDKs as the oracle for the loopback server: what it streams, OpenAI's ``openai``
and Anthropic's ``anthropic`` Python clients accept, assemble and raise on exactly as they do
against the real services, and reins reads the same stream to the same text, tool calls and
usage. So the fakes the provider tests rely on speak the protocols, not only reins's reading of
them.

Each SDK runs with its own HTTP stack (httpx), its own SSE parser, and its strict response
models (``get_final_completion``, ``get_final_message`` assemble and validate the stream).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from examples.support_store import make_agent
from kernel.amounts import Usage
from kernel.events import ReplyStatus
from tests.providers.conftest import Serve
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from worker.providers import AnthropicMessages, OpenAICompatible
from worker.providers.tools import anthropic_tools, openai_tools

SPECS = list(make_agent().profile.catalog.tools.values())
FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})
REFUND = {"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"}
VIEW = json.dumps({"goal": "refund the damaged item on order ord_1001"})


def openai_client(server: FakeProvider) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0, timeout=10)


def anthropic_client(server: FakeProvider) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.root_url, api_key="sk-ant-test", max_retries=0, timeout=10
    )


def openai_final(server: FakeProvider, max_tokens: int = 300) -> Any:
    """The SDK's streamed call, assembled and validated by its stream helper."""
    with (
        openai_client(server) as client,
        client.chat.completions.stream(
            model="refund-policy",
            messages=[{"role": "user", "content": VIEW}],
            tools=openai_tools(SPECS),  # type: ignore[arg-type]
            max_tokens=max_tokens,
            stream_options={"include_usage": True},
        ) as stream,
    ):
        return stream.get_final_completion()


def anthropic_final(server: FakeProvider, max_tokens: int = 300) -> Any:
    with (
        anthropic_client(server) as client,
        client.messages.stream(
            model="claude-test",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": VIEW}],
            tools=anthropic_tools(SPECS),  # type: ignore[arg-type]
        ) as stream,
    ):
        return stream.get_final_message()


def reins_openai(server: FakeProvider, cap: int = 300) -> Any:
    return OpenAICompatible(base_url=server.base_url, model="m", tools=SPECS).call(VIEW, cap, 10)


def reins_anthropic(server: FakeProvider, cap: int = 300) -> Any:
    p = AnthropicMessages(base_url=server.root_url, model="m", tools=SPECS)
    return p.call(VIEW, cap, 10)


# --- OpenAI's SDK ---------------------------------------------------------------------------


def test_openai_sdk_reads_text_and_usage_as_reins_does(serve: Serve) -> None:
    server = serve(
        [Reply(content=FINAL, prompt_tokens=1200, cached_tokens=1000)] * 2,
    )
    final = openai_final(server)
    choice = final.choices[0]
    assert choice.message.content == FINAL and choice.finish_reason == "stop"
    assert final.usage.prompt_tokens == 1200
    assert final.usage.prompt_tokens_details.cached_tokens == 1000
    streamed = final.usage.completion_tokens
    ours = reins_openai(server)
    assert ours.status is ReplyStatus.COMPLETED and ours.raw == choice.message.content
    assert ours.usage == Usage(uncached_input=200, cached_input=1000, output=streamed)


def test_openai_sdk_assembles_the_same_tool_calls(serve: Serve) -> None:
    calls = [("issue_refund", json.dumps(REFUND)), ("get_order", '{"order_id": "ord_1002"}')]
    server = serve([Reply(tool_calls=calls)] * 2)
    final = openai_final(server)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    sdk = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert [c.id for c in choice.message.tool_calls] == ["call_0", "call_1"]
    ours = reins_openai(server)
    assert [(c["name"], c["args"]) for c in ours.content["calls"]] == sdk


def test_openai_sdk_sees_the_output_cap_as_length(serve: Serve) -> None:
    server = serve([Reply(content="x" * 400)] * 2)
    client = openai_client(server)
    stream = client.chat.completions.stream(
        model="m",
        messages=[{"role": "user", "content": VIEW}],
        max_tokens=10,
        response_format={"type": "json_object"},
    )
    with pytest.raises(openai.LengthFinishReasonError), stream as streaming:
        streaming.get_final_completion()  # the SDK refuses to parse a cut-off answer
    client.close()
    assert reins_openai(server, cap=10).status is ReplyStatus.TRUNCATED


def test_openai_sdk_raises_a_rate_limit_error_with_retry_after(serve: Serve) -> None:
    server = serve([Reply(status=429, headers={"retry-after": "20"})] * 2)
    with pytest.raises(openai.RateLimitError) as caught:
        openai_final(server)
    assert caught.value.status_code == 429
    assert caught.value.response.headers["retry-after"] == "20"
    assert caught.value.code == "rate_limit_exceeded"  # the error object parsed
    ours = reins_openai(server)
    assert ours.status is ReplyStatus.REJECTED and ours.retry_after_s == 20.0


def test_openai_sdk_fails_on_a_cut_stream_as_reins_does(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, cut_after=3)] * 2)
    with pytest.raises(openai.APIConnectionError):  # the chunked body ended unfinished
        openai_final(server)
    assert reins_openai(server).status is ReplyStatus.TRANSPORT_FAILURE


# --- Anthropic's SDK ------------------------------------------------------------------------


def test_anthropic_sdk_reads_text_and_usage_as_reins_does(serve: Serve) -> None:
    script = Reply(content=FINAL, prompt_tokens=30, cached_tokens=900, cache_write_tokens=70)
    server = serve([script] * 2)
    final = anthropic_final(server)
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == FINAL and final.stop_reason == "end_turn"
    u = final.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (
        30,
        900,
        70,
    )
    ours = reins_anthropic(server)
    assert ours.status is ReplyStatus.COMPLETED and ours.raw == FINAL
    assert ours.usage == Usage(
        uncached_input=30, cached_input=900, cache_write_input=70, output=u.output_tokens
    )


def test_anthropic_sdk_assembles_the_same_tool_use_blocks(serve: Serve) -> None:
    calls = [("issue_refund", json.dumps(REFUND)), ("get_order", '{"order_id": "ord_1002"}')]
    server = serve([Reply(content="Checking.", tool_calls=calls)] * 2)
    final = anthropic_final(server)
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    sdk = [(b.name, b.input) for b in uses]  # the SDK parsed each input_json_delta run
    assert sdk == [("issue_refund", REFUND), ("get_order", {"order_id": "ord_1002"})]
    ours = reins_anthropic(server)
    assert [(c["name"], c["args"]) for c in ours.content["calls"]] == sdk


def test_anthropic_sdk_sees_the_output_cap_as_max_tokens(serve: Serve) -> None:
    server = serve([Reply(content="x" * 400)] * 2)
    final = anthropic_final(server, max_tokens=10)
    assert final.stop_reason == "max_tokens" and final.content[0].text == "x" * 40
    assert reins_anthropic(server, cap=10).status is ReplyStatus.TRUNCATED


@pytest.mark.parametrize(
    ("status", "error"), [(429, anthropic.RateLimitError), (529, anthropic.OverloadedError)]
)
def test_anthropic_sdk_raises_its_errors_for_429_and_529(
    serve: Serve, status: int, error: type[Exception]
) -> None:
    server = serve([Reply(status=status, headers={"retry-after": "5"})] * 2)
    with pytest.raises(error) as caught:
        anthropic_final(server)
    assert isinstance(caught.value, anthropic.APIStatusError)
    assert caught.value.status_code == status
    assert caught.value.response.headers["retry-after"] == "5"
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    ours = reins_anthropic(server)
    assert ours.status is ReplyStatus.REJECTED and ours.retry_after_s == 5.0


def test_anthropic_sdk_raises_on_an_overloaded_event_in_the_stream(serve: Serve) -> None:
    start = {
        "type": "message_start",
        "message": {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = [json.dumps(start), json.dumps(overloaded)]
    server = serve([Reply(events=events, done=False)] * 2)
    with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
        anthropic_final(server)
    assert reins_anthropic(server).status is ReplyStatus.REJECTED


def test_anthropic_sdk_fails_on_a_cut_stream_as_reins_does(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, cut_after=3)] * 2)
    with pytest.raises(Exception) as caught:
        anthropic_final(server)
    cut = isinstance(caught.value, anthropic.APIConnectionError)
    assert cut or "incomplete chunked read" in str(caught.value), repr(caught.value)
    assert reins_anthropic(server).status is ReplyStatus.TRANSPORT_FAILURE
