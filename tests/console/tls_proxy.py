"""A TLS-terminating reverse proxy on loopback, as an ingress controller is in front of the
API: it serves HTTPS with a self-signed certificate made here (``openssl``), and passes each
request on to the API over plain HTTP with ``X-Forwarded-Proto: https`` and
``X-Forwarded-For`` set (any the client sent are dropped), from its own address
(:data:`SOURCE`, not 127.0.0.1, so that only a configured trust makes the API believe it).
Requests are read head by head (bodies by ``Content-Length``, which is all a browser's forms
send); responses, event streams included, are passed back byte for byte."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import shutil
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = "127.0.0.2"  # the proxy's address towards the API (all of 127/8 is loopback on Linux)


@dataclass(frozen=True)
class Certificate:
    """A self-signed certificate for 127.0.0.1, its key, and its public key's SHA-256 (base64:
    what Chromium's ``--ignore-certificate-errors-spki-list`` names)."""

    cert: Path
    key: Path
    spki_sha256: str


def self_signed(folder: Path) -> Certificate:
    """A new self-signed certificate for IP 127.0.0.1, valid for a day."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is missing (apt-get install -y openssl)")
    cert, key = folder / "proxy.crt", folder / "proxy.key"
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    pem = ssl.PEM_cert_to_DER_cert(cert.read_text())
    public = subprocess.run(
        [openssl, "x509", "-inform", "DER", "-pubkey", "-noout"],
        input=pem,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    der = subprocess.run(
        [openssl, "pkey", "-pubin", "-outform", "DER"],
        input=public,
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout
    return Certificate(cert, key, base64.b64encode(hashlib.sha256(der).digest()).decode())


class TlsProxy:
    """The proxy (see the module docstring), on ``127.0.0.1:port`` in a thread of its own
    (its own event loop) until :meth:`close`."""

    def __init__(self, port: int, upstream: tuple[str, int], certificate: Certificate) -> None:
        self.port, self.upstream = port, upstream
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(certificate.cert, certificate.key)
        self.requests = 0  # requests passed on, for the test to see it was used
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> TlsProxy:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        started.result(timeout=10)
        return self

    def close(self) -> None:
        """Stop listening, cut every connection, end the thread."""
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, ssl=self.context
        )

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = str(writer.get_extra_info("peername")[0]).encode()
        up_reader, up_writer = await asyncio.open_connection(*self.upstream, local_addr=(SOURCE, 0))
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                first, *fields = head[:-4].split(b"\r\n")
                kept = [f for f in fields if not f.lower().startswith(b"x-forwarded-")]
                length = 0
                for f in kept:
                    name, _, value = f.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                added = [b"X-Forwarded-Proto: https", b"X-Forwarded-For: " + peer]
                up_writer.write(b"\r\n".join([first, *kept, *added]) + b"\r\n\r\n")
                if length:
                    up_writer.write(await reader.readexactly(length))
                await up_writer.drain()
                self.requests += 1
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # the browser closed the connection (or sent what a form never sends)
        finally:
            back.cancel()
            for w in (up_writer, writer):
                w.close()
                with contextlib.suppress(Exception):
                    await w.wait_closed()
            self._connections.discard(task)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(65536):
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            sink.close()
