"""``reins bench provider``: model calls through reins's provider client against a loopback
OpenAI-compatible server, with pooled connections and with one connection per call, side by
side; and how soon a cancel closes a streaming call's socket.

The server (in this process, loopback, a thread per connection) answers each chat-completions
call at once: a short event stream (a few content chunks, the finish chunk, usage, ``[DONE]``)
on a kept-alive HTTP/1.1 connection. The two modes are the same client path
(:class:`worker.providers.OpenAICompatible` over :class:`worker.providers.http.HttpPool`), the
pool keeping connections (``pooled``) or keeping none (``keepalive_s`` 0: a new connection per
call, as every call was before pooling). ``THREADS`` client threads each make calls for a
phase; the phases alternate over ``ROUNDS`` rounds and each figure is the median of its
rounds, the ratio the median of the rounds' quotients. ``*_overhead_p99_ms`` is the 99th
percentile of a call's wall time less the server's own time for it (from the request read to
the last byte written): what the client and the connection cost. When ``openssl`` is on the
PATH the same is measured over TLS (a self-signed certificate trusted through the CA bundle
option), where a new connection also pays a handshake.

``cancel_to_closed_p99_ms``: a call streams a long answer (a chunk every 2 ms); once its first
chunk is in, its cancel token is set; the server notes when it sees the connection close (its
socket readable at EOF). Both clocks are this process's ``perf_counter``.
"""

from __future__ import annotations

import contextlib
import json
import select
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ops.bench.peers import Peer, reins_itself
from worker.providers import CancelToken, OpenAICompatible
from worker.providers.http import PoolOptions
from worker.providers.streaming import Folding

THREADS = 4
ROUNDS = 3
CALLS = 300  # per thread and phase
CANCELS = 60
CHUNKS = 8  # content chunks of a fast answer
SLOW_EVERY_S = 0.002


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    timings: dict[str, float]
    closed_at: dict[str, float]
    lock: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # As a real server does: without it, each small write after the first waits for the
        # client's delayed ACK on a kept-alive connection (40 ms), and only reuse would pay it.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        began = time.perf_counter()
        request = json.loads(raw)
        call = str(json.loads(request["messages"][-1]["content"])["call"])  # the view names it
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if request.get("model") == "slow":
            self._stream_until_closed(call)
            return
        for i in range(CHUNKS):
            self._event(_chunk({"content": f"t{i} "}, None))
        self._event(_chunk({}, "stop"))
        usage = {"prompt_tokens": 12, "completion_tokens": CHUNKS}
        self._event(json.dumps({"object": "chat.completion.chunk", "choices": [], "usage": usage}))
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        with self.server.lock:
            self.server.timings[call] = time.perf_counter() - began

    def _stream_until_closed(self, call: str) -> None:
        """A chunk every 2 ms until the client goes: note when it went."""
        self.close_connection = True
        try:
            while True:
                self._event(_chunk({"content": "x"}, None))
                readable, _, _ = select.select([self.connection], [], [], SLOW_EVERY_S)
                if readable and self.connection.recv(1, socket.MSG_PEEK) == b"":
                    break
        except OSError:
            pass
        with self.server.lock:
            self.server.closed_at[call] = time.perf_counter()

    def _event(self, payload: str) -> None:
        data = f"data: {payload}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _chunk(delta: dict[str, Any], finish: str | None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice]})


@contextlib.contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.timings, server.closed_at, server.lock = {}, {}, threading.Lock()
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Calls:
    """One phase: THREADS threads, each with calls through one shared provider."""

    def __init__(self, url: str, options: PoolOptions, server: _Server, calls: int) -> None:
        self.url, self.options, self.server, self.calls = url, options, server, calls

    def run(self) -> tuple[float, list[float], int]:
        """(calls per second, each call's overhead in seconds, connections opened)."""
        provider = OpenAICompatible(base_url=self.url, model="fast", pool_options=self.options)
        overheads: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()

        def client(n: int) -> None:
            mine = []
            for i in range(self.calls):
                call = f"{n}-{i}-{id(provider)}"
                began = time.perf_counter()
                reply = provider.call(json.dumps({"call": call}), 64, 10.0)
                took = time.perf_counter() - began
                if reply.status.value != "COMPLETED":
                    failures.append(reply.detail or reply.status.value)
                    continue
                mine.append((call, took))
            with self.server.lock:
                timed = [(took - self.server.timings.pop(call, 0.0)) for call, took in mine]
            with lock:
                overheads.extend(timed)

        threads = [threading.Thread(target=client, args=(n,)) for n in range(THREADS)]
        began = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - began
        opened = provider.http.connections_opened
        provider.close()
        if failures:
            raise RuntimeError(f"{len(failures)} calls failed, first: {failures[0]}")
        return THREADS * self.calls / elapsed, overheads, opened


def _compare(url: str, server: _Server, calls: int, ca_bundle: str = "") -> dict[str, Any]:
    pooled = PoolOptions(max_connections=THREADS, keepalive_s=60.0, ca_bundle=ca_bundle)
    single = PoolOptions(max_connections=THREADS, keepalive_s=0.0, ca_bundle=ca_bundle)
    rates: dict[str, list[float]] = {"pooled": [], "per_call": []}
    over: dict[str, list[float]] = {"pooled": [], "per_call": []}
    opened: dict[str, int] = {"pooled": 0, "per_call": 0}
    ratios = []
    for _ in range(ROUNDS):
        round_rates = {}
        for mode, options in (("per_call", single), ("pooled", pooled)):
            rate, overheads, connections = _Calls(url, options, server, calls).run()
            rates[mode].append(rate)
            over[mode].extend(overheads)
            opened[mode] += connections
            round_rates[mode] = rate
        ratios.append(round_rates["pooled"] / round_rates["per_call"])
    return {
        "pooled_calls_per_s": round(statistics.median(rates["pooled"]), 1),
        "per_call_calls_per_s": round(statistics.median(rates["per_call"]), 1),
        "ratio": round(statistics.median(ratios), 3),
        "pooled_overhead_p50_ms": round(_p(over["pooled"], 0.50) * 1000, 3),
        "pooled_overhead_p99_ms": round(_p(over["pooled"], 0.99) * 1000, 3),
        "per_call_overhead_p50_ms": round(_p(over["per_call"], 0.50) * 1000, 3),
        "per_call_overhead_p99_ms": round(_p(over["per_call"], 0.99) * 1000, 3),
        "pooled_connections": opened["pooled"],
        "per_call_connections": opened["per_call"],
    }


def _cancels(url: str, server: _Server, count: int) -> dict[str, Any]:
    """Cancel a streaming call once its first chunk is in; the server notes the close."""
    streaming = threading.Event()

    def observe(acc: Folding) -> None:
        streaming.set()

    provider = OpenAICompatible(base_url=url, model="slow", observer=observe)
    to_closed, to_return = [], []
    for i in range(count):
        call = f"cancel-{i}"
        streaming.clear()
        token = CancelToken()
        done: list[float] = []

        def work(call: str = call, token: CancelToken = token, done: list[float] = done) -> None:
            reply = provider.call(json.dumps({"call": call}), 4096, 30.0, cancel=token)
            done.append(time.perf_counter())
            if reply.status.value != "CANCELED":
                raise RuntimeError(f"a canceled call ended {reply.status.value}")

        thread = threading.Thread(target=work)
        thread.start()
        if not streaming.wait(10):
            raise RuntimeError("the slow stream never started")
        canceled_at = time.perf_counter()
        token.set()
        thread.join(30)
        deadline = time.monotonic() + 10
        while call not in server.closed_at and time.monotonic() < deadline:
            time.sleep(0.001)  # the server's handler notes the close in its own thread
        if call not in server.closed_at or not done:
            raise RuntimeError("a canceled stream was never seen to close")
        to_closed.append(server.closed_at[call] - canceled_at)
        to_return.append(done[0] - canceled_at)
    provider.close()
    return {
        "cancel_to_closed_p50_ms": round(_p(to_closed, 0.50) * 1000, 3),
        "cancel_to_closed_p99_ms": round(_p(to_closed, 0.99) * 1000, 3),
        "cancel_to_reply_p99_ms": round(_p(to_return, 0.99) * 1000, 3),
        "cancels": count,
    }


def _certificate(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 made with openssl, or None without openssl."""
    if shutil.which("openssl") is None:
        return None
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def peer() -> Peer:
    """The same client path keeping no connection: one connection (and handshake) a call."""
    return reins_itself(
        "reins provider client, one connection per call",
        "OpenAICompatible over HttpPool with keepalive_s 0 against the same loopback server, "
        "as every call was before pooling",
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; one JSON-ready object."""
    calls = 40 if quick else CALLS
    with _serving() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        out: dict[str, Any] = {
            "bench": "provider",
            "peer": peer().as_json(),
            "threads": THREADS,
            "calls": calls,
        }
        out.update(_compare(url, server, calls))
        out.update(_cancels(url, server, 10 if quick else CANCELS))
    with tempfile.TemporaryDirectory() as tmp:
        made = _certificate(Path(tmp))
        if made is None:
            out["tls"] = None
            return out
        cert, key = made
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        with _serving(context) as server:
            url = f"https://127.0.0.1:{server.server_address[1]}/v1"
            tls = _compare(url, server, calls // 2, ca_bundle=str(cert))
        out.update({f"tls_{k}": v for k, v in tls.items()})
    return out
