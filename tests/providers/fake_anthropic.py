"""The Anthropic Messages encoding of a scripted :class:`Reply`, for the loopback server.

``POST /v1/messages`` with ``stream: true`` answers as ``text/event-stream``, each event named
and typed: ``message_start`` (the message with its input usage: ``input_tokens``,
``cache_read_input_tokens``, ``cache_creation_input_tokens``), then per content block a
``content_block_start``, its deltas (``text_delta`` per token, or ``input_json_delta`` pieces of
a ``tool_use`` block's input) and a ``content_block_stop``, a ``ping`` now and then, a
``message_delta`` with the ``stop_reason`` and the output usage, and ``message_stop``.
``max_tokens`` is honoured (stop_reason ``max_tokens``). Errors are
``{"type": "error", "error": {"type", "message"}}``; 529 is ``overloaded_error``.
"""

from __future__ import annotations

import json
from typing import Any

from tests.providers.fake_replies import Out, Reply, Seen, prompt_tokens, token_pieces

PATH = "/v1/messages"
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def view_of(request: dict[str, Any]) -> str:
    """The view the provider sent: the last user message (a string or text blocks)."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content", "")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)


def error_body(status: int, message: str = "scripted") -> dict[str, Any]:
    """An error as Anthropic answers one."""
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event_name(payload: str) -> str | None:
    """Each event is named by its type, as Anthropic names them (its SDK raises on an event
    named ``error``); a payload that is not an object is sent unnamed."""
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        return None
    kind = data.get("type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def _blocks(reply: Reply) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each content block's start and its per-token deltas."""
    blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    text = reply.refusal if reply.refusal is not None else reply.content
    if text:
        pieces = [{"type": "text_delta", "text": p} for p in token_pieces(text)]
        blocks.append(({"type": "text", "text": ""}, pieces))
    for index, (name, arguments) in enumerate(reply.tool_calls):
        start = {"type": "tool_use", "id": f"toolu_{index:02d}", "name": name, "input": {}}
        pieces = [{"type": "input_json_delta", "partial_json": p} for p in token_pieces(arguments)]
        blocks.append((start, pieces or [{"type": "input_json_delta", "partial_json": ""}]))
    return blocks


def planned(reply: Reply) -> int:
    """How many token events the reply streams (its blocks' deltas)."""
    return sum(len(pieces) for _, pieces in _blocks(reply))


def stream(out: Out, reply: Reply, request: dict[str, Any], seen: Seen) -> None:
    """Stream ``reply`` as Messages events (see the module docstring)."""
    cap = request.get("max_tokens")
    seen.planned_tokens = planned(reply)
    usage_in = {
        "input_tokens": prompt_tokens(reply, view_of(request)),
        "cache_creation_input_tokens": reply.cache_write_tokens,
        "cache_read_input_tokens": reply.cached_tokens,
        "output_tokens": 1,
    }
    message = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": str(request.get("model", "fake")),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage_in,
    }
    out.event(json.dumps({"type": "message_start", "message": message}), "message_start")
    out.event(json.dumps({"type": "ping"}), "ping")
    sent, capped = 0, False
    for index, (start, pieces) in enumerate(_blocks(reply)):
        if capped:
            break
        head = {"type": "content_block_start", "index": index, "content_block": start}
        out.event(json.dumps(head), "content_block_start")
        for delta in pieces:
            if isinstance(cap, int) and sent >= cap:
                capped = True
                break
            if reply.cut_after is not None and sent >= reply.cut_after:
                raise ConnectionAbortedError  # close mid-message: a cut stream
            body = {"type": "content_block_delta", "index": index, "delta": delta}
            out.event(json.dumps(body), "content_block_delta")
            sent += 1
            seen.sent_tokens = sent
            if out.client_gone(reply.delay_s):
                raise ConnectionResetError
        out.event(json.dumps({"type": "content_block_stop", "index": index}), "content_block_stop")
    reason = "max_tokens" if capped else reply.finish_reason
    if reason is None:
        reason = "refusal" if reply.refusal is not None else None
    if reason is None:
        reason = "tool_use" if reply.tool_calls else "end_turn"
    output = reply.completion_tokens if reply.completion_tokens is not None else sent
    delta_usage = {"output_tokens": output}
    end = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None}}
    out.event(json.dumps({**end, "usage": delta_usage}), "message_delta")
    seen.finished = True
    if reply.done:
        out.event(json.dumps({"type": "message_stop"}), "message_stop")
    out.end()
