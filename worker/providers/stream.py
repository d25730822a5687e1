"""Chat-completions answers, streamed or whole, folded into one normalised reply.

:func:`~worker.providers.sse.sse_payloads` cuts an event stream into its ``data:`` payloads
(read up to ``data: [DONE]``), :class:`Accumulator` folds chunks into the message so far, and
:func:`finished` normalises a complete exchange.
Status rules (seed 004 table 4) for an exchange that ran to its end: an ``error`` object or a
chunk that is not a chat-completion chunk is FAULTED; a ``refusal`` or ``finish_reason ==
"content_filter"`` is REFUSED; ``"length"`` is TRUNCATED (what streamed is raw text, never
content); ``stop``, ``tool_calls`` or ``function_call`` is COMPLETED; any other or no
``finish_reason`` is FAULTED. A stream that ends before ``data: [DONE]`` is cut: the caller
reports TRANSPORT_FAILURE. See docs/adr/0044-openai-compatible-provider.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from kernel.amounts import Usage
from kernel.events import ReplyStatus
from worker.providers.sse import PARTIAL_CHARS, ProtocolError, StreamCut, sse_payloads
from worker.providers.tools import ToolCallText, proposal

__all__ = ["Accumulator", "ProtocolError", "StreamCut", "finished", "parse_usage", "sse_payloads"]

DONE = "[DONE]"
COMPLETED_REASONS = frozenset({"stop", "tool_calls", "function_call"})
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(.*)\n\s*```$", re.DOTALL)


@dataclass
class _Call:
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    whole: dict[str, Any] | None = None  # arguments sent as an object, not as text


@dataclass
class Accumulator:
    """The message so far: content, refusal, tool calls by index, finish reason, usage."""

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    calls: dict[int, _Call] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    chunks: int = 0

    def add(self, payload: str) -> None:
        """Fold one ``data`` payload (a chunk, or a whole completion) into the message."""
        try:
            obj = json.loads(payload)
        except json.JSONDecodeError:
            raise ProtocolError(f"malformed JSON in a chunk: {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise ProtocolError("a chunk is not a JSON object")
        self.chunks += 1
        if obj.get("error"):
            self.error = error_text(obj["error"])
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise ProtocolError("choices is not a list")
        for choice in choices:
            self._add_choice(choice)

    def _add_choice(self, choice: Any) -> None:
        """Fold the first choice's delta (or whole message) and its finish reason."""
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return  # n=1 is asked for; other choices are not ours
        delta = choice.get("delta", choice.get("message")) or {}
        if not isinstance(delta, dict):
            raise ProtocolError("a choice's delta is not an object")
        self._add_delta(delta)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def _add_delta(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        tool_calls = delta.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise ProtocolError("tool_calls is not a list")
        for i, tc in enumerate(tool_calls):
            if not isinstance(tc, dict):
                raise ProtocolError("a tool call is not an object")
            index = tc.get("index", i)
            call = self.calls.setdefault(index if isinstance(index, int) else i, _Call())
            fn = tc.get("function") or {}
            if isinstance(fn.get("name"), str):
                call.name += fn["name"]
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments.append(args)
            elif isinstance(args, dict):
                call.whole = args

    def tool_calls(self) -> list[ToolCallText]:
        """The tool calls in index order."""
        return [
            ToolCallText(c.name, c.whole if c.whole is not None else "".join(c.arguments))
            for _, c in sorted(self.calls.items())
        ]

    def closed_tool_calls(self) -> int:
        """Tool calls streamed in full so far: each one followed by the start of another."""
        return max(len(self.calls) - 1, 0)

    def text(self) -> str:
        """Everything the model produced so far, as text (diagnostics)."""
        parts = ["".join(self.content)] if self.content else []
        parts += [f"{c.name}({c.arguments!s})" for c in self.tool_calls()]
        return "\n".join(parts)

    def partial(self) -> str | None:
        """The bounded text of a stream that did not finish."""
        text = self.text()
        return text[:PARTIAL_CHARS] if text else None

    def seen_usage(self) -> Usage | None:
        """The usage reported so far (None: none, or none usable)."""
        return parse_usage(self.usage)


def error_text(error: Any) -> str:
    """An error object's message (and code), bounded."""
    if isinstance(error, dict):
        message = str(error.get("message") or error.get("type") or "error")
        code = error.get("code")
        return f"{message} ({code})"[:500] if code else message[:500]
    return str(error)[:500]


def parse_usage(raw: dict[str, Any] | None) -> Usage | None:
    """Usage from ``usage``: cached prompt tokens split out of the prompt; None if unusable."""
    if raw is None:
        return None

    def count(value: Any) -> int | None:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return value if ok else None

    prompt, output = count(raw.get("prompt_tokens")), count(raw.get("completion_tokens"))
    details = raw.get("prompt_tokens_details") or {}
    cached = count(details.get("cached_tokens", 0) if isinstance(details, dict) else 0)
    if prompt is None or output is None or cached is None:
        return None  # no usable evidence: the reservation stays
    cached = min(cached, prompt)
    return Usage(uncached_input=prompt - cached, cached_input=cached, output=output)


def parse_text(text: str) -> Any:
    """A plan or final answer given as JSON text (a surrounding code fence is allowed);
    None when it is not JSON, which the kernel observes as a malformed reply."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return None


@dataclass(frozen=True)
class FinishedExchange:
    """A finished exchange, normalised."""

    status: ReplyStatus
    content: Any = None
    raw: str | None = None
    usage: Usage | None = None
    detail: str | None = None


def finished(acc: Accumulator, keep_plan_step: frozenset[str]) -> FinishedExchange:
    """Normalise a complete exchange; see the module docstring for the status rules."""
    usage = parse_usage(acc.usage)
    if acc.error is not None:
        return FinishedExchange(
            ReplyStatus.FAULTED, raw=acc.partial(), usage=usage, detail=acc.error
        )
    reason = acc.finish_reason
    if acc.refusal or reason == "content_filter":
        text = "".join(acc.refusal) or acc.partial()
        return FinishedExchange(
            ReplyStatus.REFUSED, raw=text, usage=usage, detail=f"refused ({reason})"
        )
    if reason == "length":
        return FinishedExchange(ReplyStatus.TRUNCATED, raw=acc.text(), usage=usage, detail="length")
    if reason not in COMPLETED_REASONS:
        why = "no finish_reason" if reason is None else f"unknown finish_reason {reason!r}"
        return FinishedExchange(ReplyStatus.FAULTED, raw=acc.partial(), usage=usage, detail=why)
    calls = acc.tool_calls()
    if calls:
        content = proposal(calls, keep_plan_step)
        return FinishedExchange(ReplyStatus.COMPLETED, content, json.dumps(content), usage)
    text = "".join(acc.content)
    return FinishedExchange(ReplyStatus.COMPLETED, parse_text(text), text, usage)
