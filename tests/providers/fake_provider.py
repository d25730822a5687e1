"""A loopback model provider for tests: real HTTP on 127.0.0.1 speaking both protocols.

``POST /v1/chat/completions`` is OpenAI's chat completions (``fake_openai.py``) and
``POST /v1/messages`` Anthropic's Messages (``fake_anthropic.py``), and ``POST /v1/embeddings``
OpenAI's embeddings (``fake_embeddings.py``, deterministic vectors); each request is answered by
the script, a :class:`~tests.providers.fake_replies.Reply` per request, with the protocol's
own stream, errors and headers. Connections are kept alive (HTTP/1.1) unless a reply cuts its
stream or ``keep_alive`` is off, so a pooled client reuses them; :attr:`FakeProvider.connections`
counts those accepted. With a :class:`RateLimit`, requests past the window's quota are refused
with 429 in the protocol's form. Every request is logged in a
:class:`~tests.providers.fake_replies.Seen`, including whether and when the client
disconnected before the last token was sent.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.providers import fake_anthropic, fake_embeddings, fake_openai
from tests.providers.fake_replies import RateLimit, Reply, Script, Seen

ENCODINGS = {
    fake_openai.PATH: fake_openai,
    fake_anthropic.PATH: fake_anthropic,
    fake_embeddings.PATH: fake_embeddings,
}


class FakeProvider:
    """The server; use as a context manager, or ``start()`` and ``stop()``."""

    def __init__(
        self,
        script: Script | Sequence[Reply],
        limit: RateLimit | None = None,
        *,
        keep_alive: bool = True,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not callable(script):
            replies = list(script)
            script = lambda request, i: replies[min(i, len(replies)) - 1]  # noqa: E731
        self.script: Script = script
        self.limit = limit
        self.keep_alive = keep_alive
        self.tls = tls
        self.seen: list[Seen] = []
        self.errors: list[BaseException] = []
        self.connections = 0
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root_url(self) -> str:
        """The server's origin (what Anthropic's SDK takes as its base URL)."""
        assert self._httpd is not None, "start() first"
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def base_url(self) -> str:
        """The origin and ``/v1`` (what OpenAI clients take as their base URL)."""
        return self.root_url + "/v1"

    def start(self) -> FakeProvider:
        fake = self

        class Handler(_Handler):
            server_fake = fake

        httpd = _Server(("127.0.0.1", 0), Handler)
        httpd.errors = self.errors
        if self.tls is not None:  # a client that refuses the certificate fails the handshake
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-provider"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            with self._lock:  # kept-alive connections wait for a next request: end them
                for sock in self._open:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record(self, seen: Seen) -> int:
        with self._lock:
            self.seen.append(seen)
            return len(self.seen)

    def accepted(self, sock: socket.socket) -> int:
        with self._lock:
            self.connections += 1
            self._open.add(sock)
            return self.connections

    def gone(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)


class _Server(ThreadingHTTPServer):
    """Joins every handler on close; a handler's failure is kept for the test, not printed."""

    daemon_threads = False
    block_on_close = True
    errors: list[BaseException]

    def handle_error(self, request: Any, client_address: Any) -> None:
        failure = sys.exc_info()[1]
        self.errors.append(RuntimeError(f"handler failed for {client_address}: {failure!r}"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_fake: FakeProvider
    timeout = 30  # an idle kept-alive connection is let go after this

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as servers do
        self.connection_number = self.server_fake.accepted(self.connection)

    def finish(self) -> None:
        self.server_fake.gone(self.connection)
        super().finish()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionResetError):  # the client let a kept-alive one go
            self.close_connection = True

    def do_POST(self) -> None:
        fake = self.server_fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            request = json.loads(raw)
        except json.JSONDecodeError:
            request = {"unparsable": raw.decode("utf-8", "replace")}
        seen = Seen(
            request=request,
            headers={k.lower(): v for k, v in self.headers.items()},
            path=self.path,
            connection=self.connection_number,
        )
        n = fake.record(seen)
        self.close_connection = not fake.keep_alive or fake._stopping.is_set()
        encoding = ENCODINGS.get(self.path)
        try:
            if encoding is None:
                self._whole(404, {"error": {"message": f"no route {self.path}"}}, {})
            elif fake.limit is not None:
                answered, headers = fake.limit.take(request)
                if not answered:
                    self._whole(429, encoding.error_body(429, "rate limited"), headers)
                else:
                    reply = fake.script(request, n)
                    reply.headers.update(headers)
                    self._answer(encoding, reply, request, seen)
            else:
                self._answer(encoding, fake.script(request, n), request, seen)
        except ConnectionAbortedError:  # the script cut the stream
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            seen.disconnected = True
            seen.disconnected_at = seen.disconnected_at or time.monotonic()
            self.close_connection = True
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

    def _answer(self, encoding: Any, reply: Reply, request: dict[str, Any], seen: Seen) -> None:
        headers = dict(reply.headers)
        if reply.latency_ms is not None:
            headers["openai-processing-ms"] = str(reply.latency_ms)
        if reply.first_byte_s and self.client_gone(reply.first_byte_s):
            raise ConnectionResetError
        if reply.status != 200 or reply.body is not None:
            body = reply.body or encoding.error_body(reply.status)
            self._whole(reply.status, body, headers)
            return
        if encoding is fake_embeddings:  # a whole JSON answer, not a stream
            self._whole(200, fake_embeddings.body_of(request), headers)
            seen.finished = True
            return
        self.send_response(200)
        for k, v in {"Content-Type": "text/event-stream", **headers}.items():
            self.send_header(k, v)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if reply.events is not None:
            for payload in reply.events:
                self.event(payload, encoding.event_name(payload))
            if reply.done and encoding is fake_openai:
                self.event("[DONE]")
            self.end()
            return
        encoding.stream(self, reply, request, seen)

    # --- what the encoders write through (tests.providers.fake_replies.Out) -----------------

    def event(self, payload: str, name: str | None = None) -> None:
        head = f"event: {name}\n" if name else ""
        data = f"{head}data: {payload}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def client_gone(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` (the scripted pace) and say whether the client hung up.

        The client sends nothing after its request, so a readable socket means it closed."""
        if self.server_fake._stopping.is_set():
            return True
        readable, _, _ = select.select([self.connection], [], [], wait_s)
        if not readable:
            return False
        try:
            gone = self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            gone = True
        if gone:
            self._seen_gone()
        return gone

    def _seen_gone(self) -> None:
        for seen in reversed(self.server_fake.seen):
            if seen.connection == self.connection_number and seen.disconnected_at is None:
                seen.disconnected_at = time.monotonic()
                return


#: The name the OpenAI-only server had; it speaks both protocols now.
FakeOpenAI = FakeProvider
