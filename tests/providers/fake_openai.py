"""A local OpenAI-compatible chat-completions server, for tests: real HTTP on loopback.

It speaks the contract the provider relies on: ``POST /v1/chat/completions``, answers as
``text/event-stream`` with chunked transfer encoding, one ``data:`` chunk per token, a
``finish_reason`` chunk, a usage chunk (``prompt_tokens``, ``completion_tokens``,
``prompt_tokens_details.cached_tokens``) when ``stream_options.include_usage`` asks for it, and
``data: [DONE]``. ``max_tokens`` is honoured (finish_reason ``length``). A :class:`Reply` scripts
each answer: text or tool calls, usage, a delay between tokens, a reported latency (the
``openai-processing-ms`` header), an HTTP status and headers, or a fault (error body, malformed
chunk, cut stream). Every request is logged in a :class:`Seen`, including whether the client
disconnected before the last token was sent.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kernel.render import estimate_tokens

TOKEN_CHARS = 4  # one streamed token is four characters, as the kernel's estimator counts


@dataclass
class Reply:
    """One scripted answer (see the module docstring)."""

    content: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments text)
    refusal: str | None = None
    finish_reason: str | None = None  # default: "tool_calls" with tool calls, else "stop"
    prompt_tokens: int | None = None  # default: the estimate of the last user message
    cached_tokens: int = 0
    completion_tokens: int | None = None  # default: the tokens streamed
    latency_ms: float | None = None  # reported in the openai-processing-ms header
    delay_s: float = 0.0  # server-side pause after each token chunk
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None  # answer with this body as application/json instead of a stream
    events: list[str] | None = None  # stream these data payloads verbatim instead
    cut_after: int | None = None  # drop the connection after this many token chunks
    done: bool = True  # end with data: [DONE]


@dataclass
class Seen:
    """What the server saw and did for one request."""

    request: dict[str, Any]
    headers: dict[str, str]
    planned_tokens: int = 0
    sent_tokens: int = 0
    finished: bool = False  # the finish_reason chunk was sent
    disconnected: bool = False  # the client went away while the answer was streaming
    closed: threading.Event = field(default_factory=threading.Event)  # the handler is done


Script = Callable[[dict[str, Any], int], Reply]


@dataclass
class RateLimit:
    """A provider's request quota in fixed windows: past ``requests`` in a window, a request is
    refused with 429 and ``retry-after-ms`` (the time to the window's end); an answered one
    says what is left (``x-ratelimit-remaining-requests``, ``x-ratelimit-reset-requests``)
    unless ``quiet``. ``log`` keeps each request's (window, refused, the request) in order."""

    requests: int
    window_s: float
    quiet: bool = False
    started: float = field(default_factory=time.monotonic)
    log: list[tuple[int, bool, dict[str, Any]]] = field(default_factory=list)
    _used: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: dict[str, Any]) -> tuple[bool, dict[str, str]]:
        """Count one request: (answered, the rate-limit headers of its answer)."""
        with self._lock:
            since = time.monotonic() - self.started
            window = int(since // self.window_s)
            reset = (window + 1) * self.window_s - since
            used = self._used.get(window, 0)
            refused = used >= self.requests
            self.log.append((window, refused, request))
            if refused:
                return False, {"retry-after-ms": str(int(reset * 1000) + 1)}
            self._used[window] = used + 1
        if self.quiet:
            return True, {}
        return True, {
            "x-ratelimit-limit-requests": str(self.requests),
            "x-ratelimit-remaining-requests": str(self.requests - used - 1),
            "x-ratelimit-reset-requests": f"{reset:.3f}s",
        }


def token_pieces(text: str) -> list[str]:
    """Cut text into streamed tokens of TOKEN_CHARS characters."""
    return [text[i : i + TOKEN_CHARS] for i in range(0, len(text), TOKEN_CHARS)]


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


class FakeOpenAI:
    """The server; use as a context manager, or ``start()`` and ``stop()``."""

    def __init__(self, script: Script | Sequence[Reply], limit: RateLimit | None = None) -> None:
        if not callable(script):
            replies = list(script)
            script = lambda request, i: replies[min(i, len(replies)) - 1]  # noqa: E731
        self.script: Script = script
        self.limit = limit
        self.seen: list[Seen] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start() first"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeOpenAI:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        httpd = _Server(("127.0.0.1", 0), Handler)
        httpd.errors = self.errors
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, seen: Seen) -> int:
        with self._lock:
            self.seen.append(seen)
            return len(self.seen)


class _Server(ThreadingHTTPServer):
    """Joins every handler on close; a handler's failure is kept for the test, not printed."""

    daemon_threads = False
    errors: list[BaseException]

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.errors.append(RuntimeError(f"handler failed for {client_address}"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeOpenAI

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        fake = self.server_fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            request = json.loads(raw)
        except json.JSONDecodeError:
            request = {"unparsable": raw.decode("utf-8", "replace")}
        seen = Seen(request=request, headers={k.lower(): v for k, v in self.headers.items()})
        n = fake.record(seen)
        self.close_connection = True
        try:
            if self.path != "/v1/chat/completions":
                self._whole(404, {"error": {"message": f"no route {self.path}"}}, {})
            elif fake.limit is not None:
                answered, headers = fake.limit.take(request)
                if not answered:
                    limited = {"error": {"message": "rate limited", "type": "requests"}}
                    self._whole(429, limited, headers)
                else:
                    reply = fake.script(request, n)
                    reply.headers.update(headers)
                    self._answer(reply, request, seen)
            else:
                self._answer(fake.script(request, n), request, seen)
        except (BrokenPipeError, ConnectionResetError):
            seen.disconnected = True
        finally:
            seen.closed.set()

    def _whole(self, status: int, body: Any, headers: dict[str, str]) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self, reply: Reply, request: dict[str, Any], seen: Seen) -> None:
        headers = dict(reply.headers)
        if reply.latency_ms is not None:
            headers["openai-processing-ms"] = str(reply.latency_ms)
        if reply.status != 200 or reply.body is not None:
            self._whole(reply.status, reply.body or {"error": {"message": "scripted"}}, headers)
            return
        self.send_response(200)
        for k, v in {"Content-Type": "text/event-stream", **headers}.items():
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if reply.events is not None:
            for payload in reply.events:
                self._event(payload)
            self._end(reply.done)
            return
        self._stream(reply, request, seen)

    def _stream(self, reply: Reply, request: dict[str, Any], seen: Seen) -> None:
        cap = request.get("max_tokens")
        planned = deltas(reply)
        seen.planned_tokens = len(planned)
        sent = planned if not isinstance(cap, int) else planned[:cap]
        for i, delta in enumerate(sent):
            if reply.cut_after is not None and i >= reply.cut_after:
                return  # close without the last chunk: a cut stream
            self._event(_chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
            seen.sent_tokens = i + 1
            if self._client_gone(reply.delay_s):
                seen.disconnected = True
                return
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        if len(sent) < len(planned):
            finish = "length"
        self._event(_chunk([{"index": 0, "delta": {}, "finish_reason": finish}]))
        seen.finished = True
        if (request.get("stream_options") or {}).get("include_usage"):
            messages = [m for m in request.get("messages", []) if m.get("role") == "user"]
            view = str(messages[-1].get("content", "")) if messages else ""
            usage: dict[str, Any] = {
                "prompt_tokens": reply.prompt_tokens
                if reply.prompt_tokens is not None
                else estimate_tokens(view),
                "completion_tokens": reply.completion_tokens
                if reply.completion_tokens is not None
                else len(sent),
                "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
            }
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            self._event(_chunk([], usage))
        self._end(reply.done)

    def _event(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _end(self, done: bool) -> None:
        if done:
            self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _client_gone(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` (the scripted pace) and say whether the client hung up.

        The client sends nothing after its request, so a readable socket means it closed."""
        if self.server_fake._stopping.is_set():
            return True
        readable, _, _ = select.select([self.connection], [], [], wait_s)
        if not readable:
            return False
        try:
            return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True


def _chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage
    return json.dumps(body)
