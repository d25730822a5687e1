"""Pooled streaming HTTP for the model providers: one bounded pool of connections per route.

:class:`HttpPool` keeps up to ``max_connections`` connections to one provider route open and
reuses them call after call (``keepalive_s`` 0: one connection per call, none kept). One call is
one :meth:`HttpPool.exchange`: within it, every wait on the network (the turn for a pooled
connection, connecting, the TLS handshake, each write and each read) is bounded by what is left
of the call's deadline, and a cancel shuts the call's socket down from the canceller's thread,
so the read in progress ends at once, the server sees the connection go, and the connection is
closed rather than returned to the pool. TLS certificates are always verified, against the
system's authorities or a CA bundle.

The pool is httpcore's, the engine of httpx: its ``network_backend`` is the one seam through
which every socket operation passes, which is where the deadline and the cancel reach the socket
(httpx's ``Client`` does not expose it). Why: docs/adr/0200-pooled-providers.md.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpcore
from httpcore import NetworkBackend, NetworkStream

from kernel.settings import Settings
from worker.providers.base import CancelToken, ProviderConfigError

Clock = Callable[[], float]
MAX_DRAIN = 64 * 1024  # bytes read past the end of a stream to hand its connection back
HEAD_BYTES = 512  # the first bytes of a body, kept for diagnosis when it does not parse


@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How a provider route's pool behaves (``REINS_PROVIDER_*``)."""

    max_connections: int = 32
    keepalive_s: float = 60.0  # 0: every connection is closed after its call
    ca_bundle: str = ""  # PEM of trusted authorities; "": the system's

    @classmethod
    def from_settings(cls, settings: Settings) -> PoolOptions:
        """The options the settings give."""
        return cls(
            settings.provider_max_connections,
            settings.provider_keepalive_s,
            settings.provider_ca_bundle,
        )


class TransportError(Exception):
    """The exchange broke: connection refused or cut, a protocol error, or a timeout."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass(frozen=True, slots=True)
class Answer:
    """A response as it starts: status, headers (names lower-cased) and the body's lines."""

    status: int
    headers: dict[str, str]
    body: LineReader


class LineReader:
    """The body of a response read line by line (for server-sent events) or whole."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = bytearray()
        self._eof = False
        self._head = bytearray()

    @property
    def head(self) -> str:
        """The body's first bytes (up to ``HEAD_BYTES``) as received, for diagnosis."""
        return self._head.decode("utf-8", "replace")

    def _more(self) -> bool:
        if self._eof:
            return False
        chunk = next(self._chunks, None)
        if chunk is None:
            self._eof = True
            return False
        if len(self._head) < HEAD_BYTES:
            self._head += chunk[: HEAD_BYTES - len(self._head)]
        self._buffer += chunk
        return True

    def readline(self, limit: int) -> bytes:
        """The next line with its ``\\n`` (at most ``limit`` bytes); b"" at the end."""
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0 and end < limit:
                line = bytes(self._buffer[: end + 1])
                del self._buffer[: end + 1]
                return line
            if len(self._buffer) >= limit:
                line = bytes(self._buffer[:limit])
                del self._buffer[:limit]
                return line
            start = len(self._buffer)
            if not self._more():
                line = bytes(self._buffer)
                self._buffer.clear()
                return line

    def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of what is left of the body."""
        while len(self._buffer) < limit and self._more():
            pass
        out = bytes(self._buffer[:limit])
        del self._buffer[:limit]
        return out

    def drain(self, limit: int = MAX_DRAIN) -> bool:
        """Read to the end of the body (at most ``limit`` bytes), so the connection can be
        used again; False when more was left."""
        seen = len(self._buffer)
        self._buffer.clear()
        while seen <= limit and self._more():
            seen += len(self._buffer)
            self._buffer.clear()
        return self._eof


class _Exchange:
    """One call's bounds, known to the socket operations made in its thread."""

    def __init__(self, deadline: float, clock: Clock) -> None:
        self.deadline, self.clock = deadline, clock
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.aborted = False
        self.ended = False

    def left(self) -> float:
        return self.deadline - self.clock()

    def attach(self, sock: socket.socket | None) -> None:
        """The socket the call uses now: the one a cancel shuts down."""
        with self._lock:
            if self.aborted:
                _shut(sock)
                raise httpcore.ReadError("the call was canceled")
            self._sock = sock

    def abort(self) -> None:
        """Cancel: shut the call's socket down (a no-op once the call ended: its connection
        may be serving another call by then)."""
        with self._lock:
            if self.ended:
                return
            self.aborted = True
            sock = self._sock
        _shut(sock)

    def end(self) -> None:
        with self._lock:
            self.ended = True
            self._sock = None


def _shut(sock: socket.socket | None) -> None:
    """Shut both directions now; ``socket.socket.shutdown`` so a TLS socket is not unwrapped
    under the thread that reads it."""
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


_current = threading.local()


def _bound(stream: NetworkStream, timeout: float | None, late: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of the current call's deadline, after attaching the
    stream's socket to the call (so a cancel reaches it)."""
    ex: _Exchange | None = getattr(_current, "exchange", None)
    if ex is None:
        return timeout
    ex.attach(stream.get_extra_info("socket"))
    left = ex.left()
    if left <= 0:
        raise late("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _BoundedStream(NetworkStream):
    """A connection's stream whose every wait is bounded by the calling exchange."""

    def __init__(self, inner: NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bound(self._inner, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bound(self._inner, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> NetworkStream:
        bounded = _bound(self._inner, timeout, httpcore.ConnectTimeout)
        return _BoundedStream(self._inner.start_tls(ssl_context, server_hostname, bounded))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(NetworkBackend):
    """httpcore's synchronous backend, its connections bounded and counted."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._lock = threading.Lock()
        self.opened = 0

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> NetworkStream:
        ex: _Exchange | None = getattr(_current, "exchange", None)
        if ex is not None:
            if ex.aborted:
                raise httpcore.ConnectError("the call was canceled")
            left = ex.left()
            if left <= 0:
                raise httpcore.ConnectTimeout("the call's deadline passed")
            timeout = left if timeout is None else min(timeout, left)
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        with self._lock:
            self.opened += 1
        return _BoundedStream(stream)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> NetworkStream:  # pragma: no cover - providers are reached over TCP
        raise httpcore.UnsupportedProtocol("providers are reached over TCP")

    def sleep(self, seconds: float) -> None:  # pragma: no cover - the pool never retries
        time.sleep(seconds)


def tls_context(ca_bundle: str = "") -> ssl.SSLContext:
    """Verifying TLS: the system's authorities, or those of ``ca_bundle`` (a PEM file)."""
    try:
        return ssl.create_default_context(cafile=ca_bundle or None)
    except (OSError, ssl.SSLError) as exc:
        raise ProviderConfigError(
            f"REINS_PROVIDER_CA_BUNDLE: cannot read {ca_bundle!r} ({exc})",
            field="provider_ca_bundle",
        ) from None


class HttpPool:
    """The pooled connections of one provider route (see the module docstring); thread-safe."""

    def __init__(self, base_url: str, options: PoolOptions | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ProviderConfigError(
                f"base URL {base_url!r} must be an http(s) URL with a host", field="base_url"
            )
        self.options = options or PoolOptions()
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.path = parts.path.rstrip("/")
        self._backend = _Backend()
        self._pool = httpcore.ConnectionPool(
            ssl_context=tls_context(self.options.ca_bundle) if parts.scheme == "https" else None,
            max_connections=self.options.max_connections,
            max_keepalive_connections=self.options.max_connections
            if self.options.keepalive_s > 0
            else 0,
            keepalive_expiry=self.options.keepalive_s or None,
            network_backend=self._backend,
        )
        # A provider dropped without close() (a test, a reloaded route) closes its sockets.
        weakref.finalize(self, self._pool.close)

    @property
    def connections_opened(self) -> int:
        """Connections opened since the pool was made (reuse keeps this below the calls)."""
        return self._backend.opened

    @contextlib.contextmanager
    def exchange(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        deadline: float,
        clock: Clock,
        cancel: threading.Event | None = None,
    ) -> Iterator[Answer]:
        """POST ``body`` to ``path`` (under the base URL's path) and yield the answer as it
        starts; raise :class:`TransportError` for a broken exchange. Reading the body is
        bounded and cancelable like the rest. A response read to its end hands its connection
        back to the pool; any other is closed with it."""
        ex = _Exchange(deadline, clock)
        unregister = (
            cancel.on_cancel(ex.abort) if isinstance(cancel, CancelToken) else (lambda: None)
        )
        outer = getattr(_current, "exchange", None)
        _current.exchange = ex
        left = max(ex.left(), 0.001)
        timeouts = {"pool": left, "connect": left, "read": left, "write": left}
        try:
            with self._pool.stream(
                "POST",
                self.origin + self.path + path,
                headers=list(headers.items()),
                content=body,
                extensions={"timeout": timeouts},
            ) as response:
                answer = Answer(
                    response.status,
                    {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers},
                    LineReader(response.iter_stream()),
                )
                yield answer
        # What reading the body raises comes through the yield: translated here too.
        except httpcore.TimeoutException as exc:
            raise TransportError(f"timed out: {exc!r}", timed_out=True) from None
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        finally:
            _current.exchange = outer
            ex.end()
            unregister()

    def close(self) -> None:
        """Close every connection (calls in flight end with a transport failure)."""
        self._pool.close()
