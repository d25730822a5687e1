"""What a loopback provider server is scripted with, and what it saw: shared by both protocols.

A :class:`Reply` is protocol-neutral: text or tool calls, usage (prompt, cached and cache-write
input, output), pacing (a wait before the first byte, a delay after each token), an HTTP status
and headers, or a fault (a whole error body, verbatim events, a cut stream, usage reported past
what was streamed). The OpenAI encoding is ``fake_openai.py``, Anthropic's ``fake_anthropic.py``;
``fake_provider.py`` serves both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernel.render import estimate_tokens

TOKEN_CHARS = 4  # one streamed token is four characters, as the kernel's estimator counts


@dataclass
class Reply:
    """One scripted answer (see the module docstring)."""

    content: str | None = None
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments text)
    refusal: str | None = None
    finish_reason: str | None = None  # the protocol's own word; default: from the content
    prompt_tokens: int | None = None  # default: the estimate of the last user message
    cached_tokens: int = 0  # input read from the provider's cache
    cache_write_tokens: int = 0  # input written to it (Anthropic reports these)
    completion_tokens: int | None = None  # default: the tokens streamed
    latency_ms: float | None = None  # reported in the openai-processing-ms header
    first_byte_s: float = 0.0  # server-side pause before the answer's headers (a slow reply)
    delay_s: float = 0.0  # server-side pause after each token chunk
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None  # answer with this body as application/json instead of a stream
    events: list[str] | None = None  # stream these data payloads verbatim instead
    cut_after: int | None = None  # drop the connection after this many token chunks
    done: bool = True  # end the stream properly ([DONE], message_stop)


@dataclass
class Seen:
    """What the server saw and did for one request."""

    request: dict[str, Any]
    headers: dict[str, str]
    path: str = ""
    connection: int = 0  # which accepted connection carried it (1, 2, ...)
    planned_tokens: int = 0
    sent_tokens: int = 0
    finished: bool = False  # the finish chunk was sent
    disconnected: bool = False  # the client went away while the answer was streaming
    disconnected_at: float | None = None  # time.monotonic() when the server saw it go
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


def prompt_tokens(reply: Reply, view: str) -> int:
    """The prompt tokens a reply reports: scripted, or the estimate of the view."""
    return reply.prompt_tokens if reply.prompt_tokens is not None else estimate_tokens(view)


class Out(Protocol):
    """What an encoder writes through: events of a chunked stream, and the client's presence."""

    def event(self, payload: str, name: str | None = None) -> None:
        """Send one server-sent event."""
        ...

    def end(self) -> None:
        """End the chunked body."""
        ...

    def client_gone(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` and say whether the client hung up."""
        ...
