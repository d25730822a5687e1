"""The Anthropic Messages provider: one streamed ``POST {base}/v1/messages`` per call.

The same contract as the chat-completions provider (``streaming.py``), over the route's pooled
connections: every wait bounded by the deadline, a cancel ends the read at once (CANCELED),
nothing is retried. HTTP 429 (rate limited), 529 (overloaded) and 503 are REJECTED, with the
retry-after seen and the ``anthropic-ratelimit-*`` headers kept for the gates; 5xx and 408 and a
broken or cut connection (EOF before ``message_stop``) are TRANSPORT_FAILURE; any other 4xx, a
malformed answer and an unknown ``stop_reason`` are FAULTED. The stream's own statuses are in
``anthropic_stream.py``. The base URL is the API's origin (``https://api.anthropic.com``, as
Anthropic's SDK takes it) or that with ``/v1``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from kernel.tools import ToolSpec
from worker.models import ModelReply
from worker.providers.anthropic_stream import MessageFold, finished
from worker.providers.http import HEAD_BYTES, Answer
from worker.providers.sse import ProtocolError, sse_payloads
from worker.providers.stream import error_text
from worker.providers.streaming import MAX_BODY, Folding, StreamedProvider, canceled
from worker.providers.tools import anthropic_tools, own_plan_step

API_VERSION = "2023-06-01"


class AnthropicMessages(StreamedProvider):
    """A Messages provider; see the module docstring for the status contract."""

    rejecting = frozenset({429, 503, 529})

    def _folding(self) -> MessageFold:
        return MessageFold()

    def _request(
        self, view: str, cap: int, specs: Sequence[ToolSpec]
    ) -> tuple[str, bytes, dict[str, str]]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": cap,
            "system": self.system_prompt,
            "messages": [{"role": "user", "content": view}],
            "stream": True,
        }
        if specs:
            body["tools"] = anthropic_tools(specs)
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "anthropic-version": API_VERSION,
        }
        if self._key:
            headers["x-api-key"] = self._key
        path = "/messages" if self.http.path.endswith("/v1") else "/v1/messages"
        return path, json.dumps(body).encode(), headers

    def _http_error(self, status: int, body: str) -> ModelReply:
        try:
            err = json.loads(body).get("error")
        except (json.JSONDecodeError, AttributeError):
            err = None
        what = f"HTTP {status}: " + (error_text(err) if err else body[:200])
        return self._by_status(status, what)

    def _read(
        self,
        answer: Answer,
        acc: Folding,
        cancel: threading.Event | None,
        specs: Sequence[ToolSpec],
    ) -> ModelReply:
        assert isinstance(acc, MessageFold)
        kind = answer.headers.get("content-type", "text/event-stream").lower()
        if "json" in kind:
            # A server that ignored stream=true answers with the whole message.
            try:
                message = json.loads(answer.body.read(MAX_BODY) or b"null")
            except json.JSONDecodeError:
                raise ProtocolError("a 200 answer that is not JSON") from None
            if not isinstance(message, dict):
                raise ProtocolError("a 200 answer that is not a message")
            if message.get("type") == "error":
                acc.add(json.dumps(message))
            else:
                acc.whole(message)
        elif "event-stream" not in kind:
            answer.body.read(HEAD_BYTES)  # its first bytes, kept for diagnosis
            raise ProtocolError(f"a 200 answer of type {kind!r}, not an event stream")
        else:
            for payload in sse_payloads(answer.body.readline):
                if cancel is not None and cancel.is_set():
                    return canceled(acc)
                acc.add(payload)
                if self.observer is not None:
                    self.observer(acc)
                if acc.stopped or acc.error is not None:
                    break
        answer.body.drain()  # the connection goes back to the pool only once read to its end
        out = finished(acc, own_plan_step(specs))
        return ModelReply(
            status=out.status, content=out.content, raw=out.raw, usage=out.usage, detail=out.detail
        )
