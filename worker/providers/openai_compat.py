"""The OpenAI-compatible chat-completions provider (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM).

One call is one streamed ``POST {base_url}/chat/completions`` on its own connection; every
socket wait is bounded by the deadline, and a cancel ends the read at once (CANCELED). HTTP 429
and 503 are REJECTED (retry-after reported, never slept on); 5xx, 408 and a broken or cut
connection are TRANSPORT_FAILURE (``timed_out`` past the deadline); a 400 for content policy is
REFUSED; any other 4xx, a 200 with an error body and a malformed answer are FAULTED. The
provider never retries (:mod:`worker.providers.retry`). See
docs/adr/0044-openai-compatible-provider.md.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kernel.events import ReplyStatus
from kernel.tools import ToolSpec
from worker.models import ModelReply
from worker.providers.base import CancelToken, ProviderConfigError
from worker.providers.headers import latency_from, rate_limit_headers, retry_after
from worker.providers.stream import (
    Accumulator,
    ProtocolError,
    StreamCut,
    error_text,
    finished,
    parse_usage,
    sse_payloads,
)
from worker.providers.tools import openai_tools, own_plan_step

SYSTEM_PROMPT = (
    "You act for a reins agent. Each user message is a JSON view of the task: goal, plan with "
    "step statuses, facts, last_result and the remaining budget. Answer in exactly one way: "
    "call one or more tools (set plan_step to the id of the plan step a call carries out); or "
    'reply with a JSON object only: {"type": "plan", "steps": [{"id": ..., "tool": ..., '
    '"depends_on": [...]}]} to set a plan, or {"type": "final", "outcome": "completed", '
    '"text": ...} when the task is done.'
)
MAX_ERROR_BODY = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
Observer = Callable[[Accumulator], None]


@dataclass
class _Exchange:
    """What one call saw, whatever way it ended."""

    acc: Accumulator
    headers: dict[str, str]
    status: int | None = None
    response: http.client.HTTPResponse | None = None  # closed when the call ends


class OpenAICompatible:
    """A chat-completions provider; see the module docstring for the status contract.

    ``clock`` measures latency and the deadline (wall time by default). ``latency_header``
    names a response header with the server's processing time in milliseconds; when present,
    it is the reply's latency instead of the measured time (see the decision record).
    ``observer`` sees the message after each chunk; it must not block.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        tools: Sequence[ToolSpec] = (),
        clock: Callable[[], float] = time.monotonic,
        latency_header: str | None = None,
        observer: Observer | None = None,
        system_prompt: str = SYSTEM_PROMPT,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProviderConfigError(f"base URL {base_url!r} must be an http(s) URL with a host")
        self.base_url, self.model, self.api_key = base_url, model, api_key
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._path = parts.path.rstrip("/") + "/chat/completions"
        self.tools = tuple(tools)
        self.clock, self.latency_header, self.observer = clock, latency_header, observer
        self.system_prompt = system_prompt

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """One streamed call; never raises (see the class docstring)."""
        start = self.clock()
        deadline = start + timeout_s
        ex = _Exchange(Accumulator(), {})
        specs = self.tools if tools is None else tuple(tools)
        try:
            reply = self._call(view, max_output_tokens, specs, deadline, cancel, ex)
        except Exception as exc:  # the contract: nothing the far side does ends the worker
            reply = ModelReply(status=ReplyStatus.FAULTED, detail=f"provider error: {exc!r}")
        latency = latency_from(ex.headers, self.latency_header)
        if latency is None:
            latency = max(self.clock() - start, 0.0)
        return reply.model_copy(
            update={
                "latency_s": round(latency, 6),
                "rate_limits": rate_limit_headers(ex.headers),
                "retry_after_s": retry_after(ex.headers, rejected=ex.status in (429, 503)),
            }
        )

    # --- one exchange ----------------------------------------------------------------------

    def _request_body(self, view: str, cap: int, specs: Sequence[ToolSpec]) -> bytes:
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
        return json.dumps(body).encode()

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _call(
        self,
        view: str,
        cap: int,
        specs: Sequence[ToolSpec],
        deadline: float,
        cancel: threading.Event | None,
        ex: _Exchange,
    ) -> ModelReply:
        if cancel is not None and cancel.is_set():
            return ModelReply(status=ReplyStatus.CANCELED, detail="canceled before it was sent")
        left = deadline - self.clock()
        if left <= 0:
            return _timed_out("the deadline passed before the request was sent")
        body, headers = self._request_body(view, cap, specs), self._headers()
        conn = self._connection(left)
        unregister = _close_on_cancel(conn, cancel)
        try:
            return self._exchange(conn, body, headers, deadline, cancel, ex, specs)
        except (OSError, http.client.HTTPException, StreamCut) as exc:
            return self._broken(exc, deadline, cancel, ex.acc)
        except ProtocolError as exc:
            if cancel is not None and cancel.is_set():
                return _canceled(ex.acc)
            return ModelReply(status=ReplyStatus.FAULTED, partial=ex.acc.partial(), detail=str(exc))
        finally:
            unregister()
            if ex.response is not None:
                ex.response.close()
            conn.close()

    def _exchange(
        self,
        conn: http.client.HTTPConnection,
        body: bytes,
        headers: dict[str, str],
        deadline: float,
        cancel: threading.Event | None,
        ex: _Exchange,
        specs: Sequence[ToolSpec],
    ) -> ModelReply:
        """Connect, send the request and read the answer; the caller maps what it raises."""
        conn.connect()
        if cancel is not None and cancel.is_set():  # canceled while connecting
            return _canceled(ex.acc)
        conn.request("POST", self._path, body=body, headers=headers)
        _bound(conn, deadline, self.clock)
        resp = ex.response = conn.getresponse()
        ex.status = resp.status
        ex.headers = {k.lower(): v for k, v in resp.getheaders()}
        if resp.status != 200:
            _bound(conn, deadline, self.clock)
            body_text = resp.read(MAX_ERROR_BODY).decode("utf-8", "replace")
            return _http_error(resp.status, body_text)
        return self._read_answer(resp, conn, deadline, cancel, ex, specs)

    def _broken(
        self, exc: Exception, deadline: float, cancel: threading.Event | None, acc: Accumulator
    ) -> ModelReply:
        """The reply of an exchange whose connection broke: canceled, timed out or a
        transport failure, with what had streamed."""
        if cancel is not None and cancel.is_set():
            return _canceled(acc)
        if isinstance(exc, TimeoutError) or self.clock() >= deadline:
            return _timed_out(f"no answer within the deadline ({exc!r})", acc)
        return ModelReply(
            status=ReplyStatus.TRANSPORT_FAILURE,
            usage=parse_usage(acc.usage),
            partial=acc.partial(),
            detail=f"transport: {exc!r}",
        )

    def _read_answer(
        self,
        resp: http.client.HTTPResponse,
        conn: http.client.HTTPConnection,
        deadline: float,
        cancel: threading.Event | None,
        ex: _Exchange,
        specs: Sequence[ToolSpec],
    ) -> ModelReply:
        acc = ex.acc
        kind = (resp.getheader("content-type") or "text/event-stream").lower()
        if "json" in kind:
            # A server that ignored stream=true answers with one whole completion.
            _bound(conn, deadline, self.clock)
            acc.add(resp.read(MAX_BODY).decode("utf-8", "replace") or "null")
        elif "event-stream" not in kind:
            raise ProtocolError(f"a 200 answer of type {kind!r}, not an event stream")
        else:

            def readline(limit: int) -> bytes:
                _bound(conn, deadline, self.clock)
                return resp.readline(limit)

            for payload in sse_payloads(readline):
                if cancel is not None and cancel.is_set():
                    return _canceled(acc)
                if payload.strip() == "[DONE]":
                    break
                acc.add(payload)
                if self.observer is not None:
                    self.observer(acc)
        out = finished(acc, own_plan_step(specs))
        return ModelReply(
            status=out.status, content=out.content, raw=out.raw, usage=out.usage, detail=out.detail
        )


def _close_on_cancel(
    conn: http.client.HTTPConnection, cancel: threading.Event | None
) -> Callable[[], None]:
    """On cancel, shut the socket down from the canceller's thread: the blocked read returns
    at once and the server sees the connection go. A plain ``threading.Event`` has no such
    hook; it is only checked between chunks."""
    if not isinstance(cancel, CancelToken):
        return lambda: None

    def shut() -> None:
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    return cancel.on_cancel(shut)


def _bound(conn: http.client.HTTPConnection, deadline: float, clock: Callable[[], float]) -> None:
    """Bound the next socket wait by what is left of the deadline."""
    left = deadline - clock()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _http_error(status: int, body: str) -> ModelReply:
    try:
        err = json.loads(body).get("error")
    except (json.JSONDecodeError, AttributeError):
        err = None
    what = f"HTTP {status}: " + (error_text(err) if err else body[:200])
    code = err.get("code") if isinstance(err, dict) else None
    if status in (429, 503):
        return ModelReply(status=ReplyStatus.REJECTED, detail=what)
    if status == 400 and code in ("content_filter", "content_policy_violation"):
        return ModelReply(status=ReplyStatus.REFUSED, detail=what)
    if status == 408 or status >= 500:
        return ModelReply(status=ReplyStatus.TRANSPORT_FAILURE, detail=what)
    return ModelReply(status=ReplyStatus.FAULTED, detail=what)


def _canceled(acc: Accumulator) -> ModelReply:
    return ModelReply(
        status=ReplyStatus.CANCELED,
        usage=parse_usage(acc.usage),
        partial=acc.partial(),
        detail="canceled in mid-stream" if acc.chunks else "canceled",
    )


def _timed_out(detail: str, acc: Accumulator | None = None) -> ModelReply:
    return ModelReply(
        status=ReplyStatus.TRANSPORT_FAILURE,
        timed_out=True,
        usage=parse_usage(acc.usage) if acc is not None else None,
        partial=acc.partial() if acc is not None else None,
        detail=detail,
    )


def from_profile_model(
    base_url: str | None,
    model: str,
    api_key_env: str | None,
    env: Mapping[str, str],
    tools: Sequence[ToolSpec],
    **options: Any,
) -> OpenAICompatible:
    """Build the provider from a profile's model reference; the key is read from ``env``
    under the variable the profile names, and a named but missing variable fails loudly."""
    if not base_url:
        raise ProviderConfigError(f"model {model!r}: openai-compatible needs a base URL")
    key = None
    if api_key_env:
        key = env.get(api_key_env)
        if not key:
            raise ProviderConfigError(f"{api_key_env} is not set (the API key of {model!r})")
    return OpenAICompatible(base_url=base_url, model=model, api_key=key, tools=tools, **options)
