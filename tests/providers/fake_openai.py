"""The OpenAI chat-completions encoding of a scripted :class:`Reply`, for the loopback server.

``POST /v1/chat/completions`` answers as ``text/event-stream``: one ``data:`` chunk per token, a
``finish_reason`` chunk, a usage chunk (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``) when ``stream_options.include_usage`` asks for it, and
``data: [DONE]``. ``max_tokens`` is honoured (finish_reason ``length``). Errors are
``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from tests.providers.fake_replies import Out, Reply, Seen, prompt_tokens, token_pieces

PATH = "/v1/chat/completions"


def view_of(request: dict[str, Any]) -> str:
    """The view the provider sent: the last user message."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    return str(users[-1].get("content", "")) if users else ""


def error_body(status: int, message: str = "scripted") -> dict[str, Any]:
    """An error as OpenAI answers one."""
    kind = "rate_limit_exceeded" if status == 429 else "server_error"
    return {"error": {"message": message, "type": kind, "code": kind, "param": None}}


def event_name(payload: str) -> str | None:
    """Chat-completion events are unnamed."""
    return None


def deltas(reply: Reply) -> list[dict[str, Any]]:
    """The per-token deltas of a reply: content pieces, then each tool call (name first)."""
    out: list[dict[str, Any]] = []
    if reply.refusal is not None:
        out += [{"refusal": p} for p in token_pieces(reply.refusal)]
    if reply.content:
        out += [{"content": p} for p in token_pieces(reply.content)]
    for index, (name, arguments) in enumerate(reply.tool_calls):
        head = {"index": index, "id": f"call_{index}", "type": "function"}
        out.append({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        out += [
            {"tool_calls": [{"index": index, "function": {"arguments": p}}]}
            for p in token_pieces(arguments)
        ]
    return out


def stream(out: Out, reply: Reply, request: dict[str, Any], seen: Seen) -> None:
    """Stream ``reply`` as chat-completion chunks (see the module docstring)."""
    cap = request.get("max_tokens")
    planned = deltas(reply)
    seen.planned_tokens = len(planned)
    sent = planned if not isinstance(cap, int) else planned[:cap]
    for i, delta in enumerate(sent):
        if reply.cut_after is not None and i >= reply.cut_after:
            raise ConnectionAbortedError  # close without the last chunk: a cut stream
        out.event(_chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
        seen.sent_tokens = i + 1
        if out.client_gone(reply.delay_s):
            raise ConnectionResetError
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    if len(sent) < len(planned):
        finish = "length"
    out.event(_chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
    seen.finished = True
    if (request.get("stream_options") or {}).get("include_usage"):
        prompt = prompt_tokens(reply, view_of(request))
        completion = reply.completion_tokens if reply.completion_tokens is not None else len(sent)
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
        }
        out.event(_chunk([], usage))
    if reply.done:
        out.event("[DONE]")
    out.end()


def _chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "fake",
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)
