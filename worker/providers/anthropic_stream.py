"""Anthropic Messages answers, streamed or whole, folded into one normalised reply.

:class:`MessageFold` folds the stream's events (``message_start``, ``content_block_start``,
``content_block_delta``, ``content_block_stop``, ``message_delta``, ``message_stop``; ``ping``
and event types it does not know are skipped, as Anthropic asks clients to) into the message
so far, and :func:`finished` normalises a complete exchange. Status rules for an exchange that
ran to ``message_stop``: an ``error`` event is REJECTED when it says the provider is overloaded
or rate limited, FAULTED otherwise; ``stop_reason`` ``refusal`` is REFUSED; ``max_tokens`` (and
``model_context_window_exceeded``) is TRUNCATED, what streamed raw text, never content;
``end_turn``, ``stop_sequence`` and ``tool_use`` are COMPLETED; any other or none is FAULTED.
Each ``tool_use`` block becomes a tool call of the proposal, its input the concatenated
``input_json_delta`` pieces (the block's own ``input`` when no piece came). Usage is the input
(``input_tokens``, uncached), ``cache_read_input_tokens`` (cached), ``cache_creation_input_tokens``
(written to the cache) and ``output_tokens``, each the last value reported.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.amounts import Usage
from kernel.events import ReplyStatus
from worker.providers.sse import PARTIAL_CHARS, ProtocolError
from worker.providers.stream import FinishedExchange, error_text, parse_text
from worker.providers.tools import ToolCallText, proposal

COMPLETED_REASONS = frozenset({"end_turn", "stop_sequence", "tool_use"})
TRUNCATED_REASONS = frozenset({"max_tokens", "model_context_window_exceeded"})
NOT_NOW_ERRORS = frozenset({"overloaded_error", "rate_limit_error"})
USAGE_FIELDS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


@dataclass
class _Block:
    kind: str
    text: list[str] = field(default_factory=list)
    name: str = ""
    pieces: list[str] = field(default_factory=list)
    whole: dict[str, Any] | None = None  # the input a tool_use block started with
    stopped: bool = False


@dataclass
class MessageFold:
    """The message so far: content blocks by index, stop reason, usage, an error event."""

    blocks: dict[int, _Block] = field(default_factory=dict)
    stop_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    error_type: str | None = None
    stopped: bool = False  # message_stop seen: the stream is complete
    chunks: int = 0

    def add(self, payload: str) -> None:
        """Fold one event's data; raise :class:`ProtocolError` for one that is not JSON or
        not an event."""
        try:
            event = json.loads(payload)
        except json.JSONDecodeError:
            raise ProtocolError(f"malformed JSON in an event: {payload[:80]!r}") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ProtocolError(f"an event without a type: {payload[:80]!r}")
        self.chunks += 1
        handler = _HANDLERS.get(event["type"])
        if handler is not None:  # ping, and types added after this build, say nothing here
            handler(self, event)

    def _on_message_start(self, event: dict[str, Any]) -> None:
        self._usage(_object(event, "message").get("usage"))

    def _on_block_start(self, event: dict[str, Any]) -> None:
        self._start(_index(event), _object(event, "content_block"))

    def _on_block_delta(self, event: dict[str, Any]) -> None:
        self._delta(_index(event), _object(event, "delta"))

    def _on_block_stop(self, event: dict[str, Any]) -> None:
        self._block(_index(event)).stopped = True

    def _on_message_delta(self, event: dict[str, Any]) -> None:
        delta = _object(event, "delta")
        if isinstance(delta.get("stop_reason"), str):
            self.stop_reason = delta["stop_reason"]
        self._usage(event.get("usage"))

    def _on_message_stop(self, event: dict[str, Any]) -> None:
        self.stopped = True

    def _on_error(self, event: dict[str, Any]) -> None:
        err = event.get("error")
        self.error = error_text(err)
        self.error_type = str(err.get("type")) if isinstance(err, dict) else None

    def whole(self, message: dict[str, Any]) -> None:
        """Fold a whole (unstreamed) message."""
        self._usage(message.get("usage"))
        content = message.get("content") or []
        if not isinstance(content, list):
            raise ProtocolError("a message's content is not a list")
        for index, block in enumerate(content):
            if not isinstance(block, dict):
                raise ProtocolError("a content block is not an object")
            self._start(index, block)
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                self.blocks[index].text = [block["text"]]
            self.blocks[index].stopped = True
        if isinstance(message.get("stop_reason"), str):
            self.stop_reason = message["stop_reason"]
        self.stopped = True

    def _usage(self, raw: Any) -> None:
        if isinstance(raw, dict):
            self.usage.update({k: raw[k] for k in USAGE_FIELDS if raw.get(k) is not None})

    def _start(self, index: int, block: dict[str, Any]) -> None:
        kind = str(block.get("type", ""))
        started = self.blocks[index] = _Block(kind)
        if kind == "tool_use":
            started.name = str(block.get("name", ""))
            if isinstance(block.get("input"), dict) and block["input"]:
                started.whole = block["input"]
        elif kind == "text" and isinstance(block.get("text"), str) and block["text"]:
            started.text.append(block["text"])

    def _block(self, index: int) -> _Block:
        found = self.blocks.get(index)
        if found is None:
            raise ProtocolError(f"an event for content block {index}, which never started")
        return found

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._block(index)
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block.text.append(delta["text"])
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            block.pieces.append(delta["partial_json"])
        # thinking, signature and citation deltas say nothing a proposal uses

    def tool_calls(self) -> list[ToolCallText]:
        """The ``tool_use`` blocks in index order."""
        return [
            ToolCallText(b.name, "".join(b.pieces) if b.pieces else (b.whole or {}))
            for _, b in sorted(self.blocks.items())
            if b.kind == "tool_use"
        ]

    def closed_tool_calls(self) -> int:
        """Tool calls streamed in full so far (their block stopped)."""
        return sum(1 for b in self.blocks.values() if b.kind == "tool_use" and b.stopped)

    def content(self) -> str:
        """The text blocks' text."""
        return "".join("".join(b.text) for _, b in sorted(self.blocks.items()) if b.kind == "text")

    def text(self) -> str:
        """Everything the model produced so far, as text (diagnostics)."""
        parts = [self.content()] if self.content() else []
        parts += [f"{c.name}({c.arguments!s})" for c in self.tool_calls()]
        return "\n".join(parts)

    def partial(self) -> str | None:
        """The bounded text of a stream that did not finish."""
        text = self.text()
        return text[:PARTIAL_CHARS] if text else None

    def seen_usage(self) -> Usage | None:
        """The usage reported so far; None without input and output counts."""
        counts = {k: self.usage.get(k, 0) for k in USAGE_FIELDS}
        if "input_tokens" not in self.usage or "output_tokens" not in self.usage:
            return None
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()
        ):
            return None  # no usable evidence: the reservation stays
        return Usage(
            uncached_input=counts["input_tokens"],
            cached_input=counts["cache_read_input_tokens"],
            cache_write_input=counts["cache_creation_input_tokens"],
            output=counts["output_tokens"],
        )


_HANDLERS: dict[str, Callable[[MessageFold, dict[str, Any]], None]] = {
    "message_start": MessageFold._on_message_start,
    "content_block_start": MessageFold._on_block_start,
    "content_block_delta": MessageFold._on_block_delta,
    "content_block_stop": MessageFold._on_block_stop,
    "message_delta": MessageFold._on_message_delta,
    "message_stop": MessageFold._on_message_stop,
    "error": MessageFold._on_error,
}


def _object(event: dict[str, Any], name: str) -> dict[str, Any]:
    value = event.get(name)
    if not isinstance(value, dict):
        raise ProtocolError(f"a {event['type']} event without an object {name!r}")
    return value


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ProtocolError(f"a {event['type']} event without an integer index")
    return index


def finished(fold: MessageFold, keep_plan_step: frozenset[str]) -> FinishedExchange:
    """Normalise a complete exchange; see the module docstring for the status rules."""
    usage = fold.seen_usage()
    if fold.error is not None:
        status = ReplyStatus.REJECTED if fold.error_type in NOT_NOW_ERRORS else ReplyStatus.FAULTED
        return FinishedExchange(status, raw=fold.partial(), usage=usage, detail=fold.error)
    reason = fold.stop_reason
    if reason == "refusal":
        return FinishedExchange(
            ReplyStatus.REFUSED, raw=fold.partial(), usage=usage, detail="refused (refusal)"
        )
    if reason in TRUNCATED_REASONS:
        return FinishedExchange(ReplyStatus.TRUNCATED, raw=fold.text(), usage=usage, detail=reason)
    if reason not in COMPLETED_REASONS:
        why = "no stop_reason" if reason is None else f"unknown stop_reason {reason!r}"
        return FinishedExchange(ReplyStatus.FAULTED, raw=fold.partial(), usage=usage, detail=why)
    calls = fold.tool_calls()
    if calls:
        content = proposal(calls, keep_plan_step)
        return FinishedExchange(ReplyStatus.COMPLETED, content, json.dumps(content), usage)
    text = fold.content()
    return FinishedExchange(ReplyStatus.COMPLETED, parse_text(text), text, usage)
