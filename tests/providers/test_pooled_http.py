"""Pooled streaming HTTP (worker/providers/http.py) against the loopback server.

Connections are reused call after call and bounded per route; every wait, the one for a pooled
connection included, is bounded by the call's deadline; a cancel still ends the read at once
and closes that call's connection (never handed back to the pool); TLS is verified, against a
CA bundle when one is set.
"""

from __future__ import annotations

import queue
import shlex
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernel.errors import ConfigError
from kernel.events import ReplyStatus
from kernel.settings import Settings
from tests.providers.conftest import Serve
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from worker.models import ModelReply
from worker.providers import CancelToken, OpenAICompatible
from worker.providers.http import PoolOptions

FINAL = '{"type": "final", "outcome": "completed", "text": "Done."}'


def provider(base_url: str, **options: object) -> OpenAICompatible:
    return OpenAICompatible(
        base_url=base_url,
        model="m",
        pool_options=PoolOptions(**options),  # type: ignore[arg-type]
    )


def in_thread(
    p: OpenAICompatible, timeout: float = 10.0, token: CancelToken | None = None
) -> queue.Queue[ModelReply]:
    replies: queue.Queue[ModelReply] = queue.Queue()
    threading.Thread(target=lambda: replies.put(p.call("{}", 300, timeout, cancel=token))).start()
    return replies


def test_calls_reuse_one_connection(serve: Serve) -> None:
    server = serve([Reply(content=FINAL)])
    p = provider(server.base_url)
    replies = [p.call("{}", 300, 10.0) for _ in range(5)]
    assert [r.status for r in replies] == [ReplyStatus.COMPLETED] * 5
    assert server.connections == 1 and p.http.connections_opened == 1
    assert {s.connection for s in server.seen} == {1}


def test_without_keepalive_each_call_opens_its_own_connection(serve: Serve) -> None:
    """Today's behaviour before pooling, kept as the benchmark's baseline: same client path."""
    server = serve([Reply(content=FINAL)])
    p = provider(server.base_url, keepalive_s=0)
    assert all(p.call("{}", 300, 10.0).status is ReplyStatus.COMPLETED for _ in range(4))
    assert server.connections == 4 and p.http.connections_opened == 4


def test_connections_per_route_are_bounded(serve: Serve) -> None:
    """Four calls at once through a pool of two: never more than two connections; the other
    calls wait for one and are answered on it."""
    server = serve([Reply(content=FINAL, delay_s=0.02)])
    p = provider(server.base_url, max_connections=2)
    pending = [in_thread(p) for _ in range(4)]
    assert [q.get(timeout=30).status for q in pending] == [ReplyStatus.COMPLETED] * 4
    assert server.connections == 2 and len(server.seen) == 4


def test_the_wait_for_a_pooled_connection_is_bounded_by_the_deadline(serve: Serve) -> None:
    first_token = threading.Event()
    release = threading.Event()

    def script(request: dict[str, object], n: int) -> Reply:
        if n == 1:
            first_token.set()
            return Reply(content=FINAL, first_byte_s=30.0)  # holds the only connection
        return Reply(content=FINAL)

    server = serve(script)
    p = provider(server.base_url, max_connections=1)
    token = CancelToken()
    held = in_thread(p, token=token)
    assert first_token.wait(30)
    late = p.call("{}", 300, 0.2)  # no connection frees up within its deadline
    assert late.status is ReplyStatus.TRANSPORT_FAILURE and late.timed_out, late
    assert len(server.seen) == 1  # it never reached the server
    token.set()
    release.set()
    assert held.get(timeout=30).status is ReplyStatus.CANCELED


def test_a_slow_first_byte_is_bounded_by_the_deadline(serve: Serve) -> None:
    server = serve([Reply(content=FINAL, first_byte_s=30.0)])
    reply = provider(server.base_url).call("{}", 300, 0.2)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.timed_out
    assert server.seen[0].closed.wait(30) and server.seen[0].disconnected


def test_a_trickling_answer_is_cut_at_the_deadline_not_per_read(serve: Serve) -> None:
    """Each token comes well within the deadline, but all of them would take ten times it:
    the deadline bounds the whole call, not each read."""
    server = serve([Reply(content="x" * 400, delay_s=0.05)])  # 100 tokens, 5 s in all
    reply = provider(server.base_url).call("{}", 300, 0.5)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.timed_out, reply
    assert server.seen[0].closed.wait(30) and not server.seen[0].finished


def test_cancel_ends_the_read_at_once_and_closes_that_connection(serve: Serve) -> None:
    """A call canceled while its answer streams: the server sees the client go before the last
    token, the connection is not handed back (the next call opens a new one), and the pool
    goes on serving."""
    streaming = threading.Event()

    def script(request: dict[str, object], n: int) -> Reply:
        if n == 2:
            streaming.set()
            return Reply(content="x" * 4000, delay_s=0.01)
        return Reply(content=FINAL)

    server = serve(script)
    p = provider(server.base_url)
    assert p.call("{}", 2000, 10.0).status is ReplyStatus.COMPLETED  # opens connection 1
    token = CancelToken()
    pending = in_thread(p, token=token)
    assert streaming.wait(30)
    token.set()
    assert pending.get(timeout=30).status is ReplyStatus.CANCELED
    canceled = server.seen[1]
    assert canceled.connection == 1  # it was reusing the pooled connection
    assert canceled.closed.wait(30) and canceled.disconnected and not canceled.finished
    assert p.call("{}", 300, 10.0).status is ReplyStatus.COMPLETED
    assert server.seen[2].connection == 2 and p.http.connections_opened == 2


def test_cancel_while_waiting_for_the_answer_ends_the_wait(serve: Serve) -> None:
    asked = threading.Event()

    def script(request: dict[str, object], n: int) -> Reply:
        asked.set()
        return Reply(content=FINAL, first_byte_s=30.0)

    server = serve(script)
    token = CancelToken()
    pending = in_thread(provider(server.base_url), token=token)
    assert asked.wait(30)
    token.set()
    reply = pending.get(timeout=10)  # long before the 30 s first byte
    assert reply.status is ReplyStatus.CANCELED and reply.usage is None
    assert server.seen[0].closed.wait(30) and server.seen[0].disconnected


# --- TLS -------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A self-signed certificate for 127.0.0.1 (openssl), and its key."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = shlex.split(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 "
        "-addext subjectAltName=IP:127.0.0.1"
    )
    done = subprocess.run(
        [*command, "-keyout", str(key), "-out", str(cert)],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    yield cert, key


def tls_server(cert: Path, key: Path) -> FakeProvider:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return FakeProvider([Reply(content=FINAL)], tls=context)


def test_tls_is_verified_by_default(certificate: tuple[Path, Path]) -> None:
    with tls_server(*certificate) as server:
        reply = provider(server.base_url).call("{}", 300, 10.0)
        assert reply.status is ReplyStatus.TRANSPORT_FAILURE
        assert "CERTIFICATE_VERIFY_FAILED" in (reply.detail or ""), reply.detail
        assert server.seen == []  # nothing was sent to a server it could not verify


def test_a_ca_bundle_setting_trusts_its_authority(certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    settings = Settings.from_env({"REINS_PROVIDER_CA_BUNDLE": str(cert)})
    with tls_server(*certificate) as server:
        p = OpenAICompatible(
            base_url=server.base_url, model="m", pool_options=PoolOptions.from_settings(settings)
        )
        assert p.call("{}", 300, 10.0).status is ReplyStatus.COMPLETED
        assert server.seen[0].headers.get("content-type") == "application/json"


def test_an_unreadable_ca_bundle_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="REINS_PROVIDER_CA_BUNDLE") as caught:
        provider("https://127.0.0.1:1/v1", ca_bundle=str(tmp_path / "missing.pem"))
    assert caught.value.field == "provider_ca_bundle"
