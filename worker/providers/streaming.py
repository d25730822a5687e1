"""What the streamed providers share: one call is one HTTP exchange on the route's pool.

:class:`StreamedProvider` holds the contract every protocol keeps (a call never raises for what
the far side does; a cancel before the request sends nothing; a spent deadline sends nothing; a
broken exchange is CANCELED, timed out or a TRANSPORT_FAILURE with what had streamed; a reply
that does not parse is FAULTED with its first bytes kept), and each protocol fills in the
request, the meaning of an HTTP error and the reading of a 200 (``openai_compat.py``,
``anthropic.py``). Rate-limit headers, retry-after and the reported latency are read from the
headers the same way for both.
"""

from __future__ import annotations

import abc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kernel.amounts import Usage
from kernel.events import ReplyStatus
from kernel.render import SYSTEM_PROMPT
from kernel.tools import ToolSpec
from worker.models import ModelReply
from worker.providers.headers import latency_from, rate_limit_headers, retry_after
from worker.providers.http import Answer, HttpPool, PoolOptions, TransportError
from worker.providers.sse import ProtocolError, StreamCut

MAX_ERROR_BODY = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


class Folding(Protocol):
    """The message so far, in either protocol: what a broken exchange keeps of it."""

    chunks: int

    def partial(self) -> str | None:
        """The bounded text streamed so far (diagnostics), or None."""
        ...

    def seen_usage(self) -> Usage | None:
        """The usage reported so far, or None."""
        ...

    def closed_tool_calls(self) -> int:
        """Tool calls streamed in full so far."""
        ...


Observer = Callable[[Folding], None]


@dataclass
class Seen:
    """What one call saw, whatever way it ended."""

    acc: Folding
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    answer: Answer | None = None


class StreamedProvider(abc.ABC):
    """A provider that streams its answer over the route's pool (see the module docstring).

    ``clock`` measures latency and the deadline (wall time by default). ``latency_header``
    names a response header with the server's processing time in milliseconds; when present,
    it is the reply's latency instead of the measured time. ``observer`` sees the message
    after each event; it must not block. ``pool`` is the route's connections (one is made
    from ``pool_options`` when not given).
    """

    #: HTTP statuses that mean "not now": REJECTED, retry-after reported.
    rejecting: frozenset[int] = frozenset({429})

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
        pool: HttpPool | None = None,
        pool_options: PoolOptions | None = None,
    ) -> None:
        self.http = pool if pool is not None else HttpPool(base_url, pool_options)
        self.base_url, self.model, self._key = base_url, model, api_key
        self.tools = tuple(tools)
        self.clock, self.latency_header, self.observer = clock, latency_header, observer
        self.system_prompt = system_prompt

    def __repr__(self) -> str:  # never the key
        return f"{type(self).__name__}({self.base_url!r}, model={self.model!r})"

    # --- the protocol's part -----------------------------------------------------------------

    @abc.abstractmethod
    def _folding(self) -> Folding:
        """A fresh accumulator of the protocol's stream."""

    @abc.abstractmethod
    def _request(
        self, view: str, cap: int, specs: Sequence[ToolSpec]
    ) -> tuple[str, bytes, dict[str, str]]:
        """The request: path under the base URL, body, headers (the key among them)."""

    @abc.abstractmethod
    def _http_error(self, status: int, body: str) -> ModelReply:
        """The reply for a non-200 answer with this body."""

    def _by_status(self, status: int, what: str) -> ModelReply:
        """An HTTP error's reply by its status: rejected (rate limited, retry later), a
        transport failure (a timeout or the server's fault), or faulted (the request's)."""
        if status in self.rejecting:
            return ModelReply(status=ReplyStatus.REJECTED, detail=what)
        if status == 408 or status >= 500:
            return ModelReply(status=ReplyStatus.TRANSPORT_FAILURE, detail=what)
        return ModelReply(status=ReplyStatus.FAULTED, detail=what)

    @abc.abstractmethod
    def _read(
        self,
        answer: Answer,
        acc: Folding,
        cancel: threading.Event | None,
        specs: Sequence[ToolSpec],
    ) -> ModelReply:
        """Read a 200 answer to its end (raising ProtocolError, StreamCut or TransportError
        for what breaks it)."""

    # --- the contract ------------------------------------------------------------------------

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """One streamed call; never raises (see the module docstring)."""
        start = self.clock()
        seen = Seen(self._folding())
        specs = self.tools if tools is None else tuple(tools)
        try:
            reply = self._call(view, max_output_tokens, specs, start + timeout_s, cancel, seen)
        except Exception as exc:  # the contract: nothing the far side does ends the worker
            reply = ModelReply(status=ReplyStatus.FAULTED, detail=f"provider error: {exc!r}")
        latency = latency_from(seen.headers, self.latency_header)
        if latency is None:
            latency = max(self.clock() - start, 0.0)
        return reply.model_copy(
            update={
                "latency_s": round(latency, 6),
                "rate_limits": rate_limit_headers(seen.headers),
                "retry_after_s": retry_after(seen.headers, rejected=seen.status in self.rejecting),
            }
        )

    def close(self) -> None:
        """Close the route's connections."""
        self.http.close()

    def _call(
        self,
        view: str,
        cap: int,
        specs: Sequence[ToolSpec],
        deadline: float,
        cancel: threading.Event | None,
        seen: Seen,
    ) -> ModelReply:
        if cancel is not None and cancel.is_set():
            return ModelReply(status=ReplyStatus.CANCELED, detail="canceled before it was sent")
        if deadline - self.clock() <= 0:
            return timed_out("the deadline passed before the request was sent")
        path, body, headers = self._request(view, cap, specs)
        try:
            with self.http.exchange(
                path, body, headers, deadline=deadline, clock=self.clock, cancel=cancel
            ) as answer:
                seen.answer, seen.status, seen.headers = answer, answer.status, answer.headers
                if answer.status != 200:
                    text = answer.body.read(MAX_ERROR_BODY).decode("utf-8", "replace")
                    answer.body.drain()
                    return self._http_error(answer.status, text)
                return self._read(answer, seen.acc, cancel, specs)
        except (TransportError, StreamCut) as exc:
            return self._broken(exc, deadline, cancel, seen.acc)
        except ProtocolError as exc:
            if cancel is not None and cancel.is_set():
                return canceled(seen.acc)
            head = seen.answer.body.head if seen.answer is not None else ""
            return ModelReply(
                status=ReplyStatus.FAULTED,
                raw=head or None,
                partial=seen.acc.partial(),
                detail=str(exc),
            )

    def _broken(
        self, exc: Exception, deadline: float, cancel: threading.Event | None, acc: Folding
    ) -> ModelReply:
        """The reply of an exchange whose connection broke: canceled, timed out or a
        transport failure, with what had streamed."""
        if cancel is not None and cancel.is_set():
            return canceled(acc)
        late = isinstance(exc, TransportError) and exc.timed_out
        if late or self.clock() >= deadline:
            return timed_out(f"no answer within the deadline ({exc})", acc)
        return ModelReply(
            status=ReplyStatus.TRANSPORT_FAILURE,
            usage=acc.seen_usage(),
            partial=acc.partial(),
            detail=f"transport: {exc}",
        )


def canceled(acc: Folding) -> ModelReply:
    """A call canceled in flight: what streamed is diagnostics only."""
    return ModelReply(
        status=ReplyStatus.CANCELED,
        usage=acc.seen_usage(),
        partial=acc.partial(),
        detail="canceled in mid-stream" if acc.chunks else "canceled",
    )


def timed_out(detail: str, acc: Folding | None = None) -> ModelReply:
    """A call that ran out of its deadline."""
    return ModelReply(
        status=ReplyStatus.TRANSPORT_FAILURE,
        timed_out=True,
        usage=acc.seen_usage() if acc is not None else None,
        partial=acc.partial() if acc is not None else None,
        detail=detail,
    )
