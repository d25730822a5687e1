"""The OpenAI-compatible chat-completions provider (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM).

One call is one streamed ``POST {base_url}/chat/completions`` on a pooled connection of the
route; every wait is bounded by the deadline, and a cancel ends the read at once (CANCELED).
HTTP 429 and 503 are REJECTED (retry-after reported, never slept on); 5xx, 408 and a broken or
cut connection are TRANSPORT_FAILURE (``timed_out`` past the deadline); a 400 for content policy
is REFUSED; any other 4xx, a 200 with an error body and a malformed answer are FAULTED. The
provider never retries (:mod:`worker.providers.retry`). See
docs/adr/0044-openai-compatible-provider.md and docs/adr/0200-pooled-providers.md.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

from kernel.events import ReplyStatus
from kernel.render import SYSTEM_PROMPT
from kernel.tools import ToolSpec
from worker.models import ModelReply
from worker.providers.http import HEAD_BYTES, Answer
from worker.providers.sse import ProtocolError, sse_payloads
from worker.providers.stream import DONE, Accumulator, error_text, finished
from worker.providers.streaming import (
    MAX_BODY,
    Folding,
    Observer,
    StreamedProvider,
    canceled,
)
from worker.providers.tools import openai_tools, own_plan_step

__all__ = ["SYSTEM_PROMPT", "Observer", "OpenAICompatible"]


class OpenAICompatible(StreamedProvider):
    """A chat-completions provider; see the module docstring for the status contract."""

    rejecting = frozenset({429, 503})

    def _folding(self) -> Accumulator:
        return Accumulator()

    def _request(
        self, view: str, cap: int, specs: Sequence[ToolSpec]
    ) -> tuple[str, bytes, dict[str, str]]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": view},
            ],
            "max_tokens": cap,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if specs:
            body["tools"] = openai_tools(specs)
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return "/chat/completions", json.dumps(body).encode(), headers

    def _http_error(self, status: int, body: str) -> ModelReply:
        try:
            err = json.loads(body).get("error")
        except (json.JSONDecodeError, AttributeError):
            err = None
        what = f"HTTP {status}: " + (error_text(err) if err else body[:200])
        code = err.get("code") if isinstance(err, dict) else None
        if status == 400 and code in ("content_filter", "content_policy_violation"):
            return ModelReply(status=ReplyStatus.REFUSED, detail=what)
        return self._by_status(status, what)

    def _read(
        self,
        answer: Answer,
        acc: Folding,
        cancel: threading.Event | None,
        specs: Sequence[ToolSpec],
    ) -> ModelReply:
        assert isinstance(acc, Accumulator)
        kind = answer.headers.get("content-type", "text/event-stream").lower()
        if "json" in kind:
            # A server that ignored stream=true answers with one whole completion.
            acc.add(answer.body.read(MAX_BODY).decode("utf-8", "replace") or "null")
        elif "event-stream" not in kind:
            answer.body.read(HEAD_BYTES)  # its first bytes, kept for diagnosis
            raise ProtocolError(f"a 200 answer of type {kind!r}, not an event stream")
        else:
            for payload in sse_payloads(answer.body.readline):
                if cancel is not None and cancel.is_set():
                    return canceled(acc)
                if payload.strip() == DONE:
                    break
                acc.add(payload)
                if self.observer is not None:
                    self.observer(acc)
        answer.body.drain()  # the connection goes back to the pool only once read to its end
        out = finished(acc, own_plan_step(specs))
        return ModelReply(
            status=out.status, content=out.content, raw=out.raw, usage=out.usage, detail=out.detail
        )
