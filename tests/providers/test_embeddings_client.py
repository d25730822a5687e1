"""The embeddings client (``worker.providers.embeddings``) against the loopback server's
``/v1/embeddings``: vectors in input order on pooled connections, the key sent, and every
failure one :class:`EmbeddingFailed` with its code."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest

from kernel.errors import ConfigError, ReinsError
from kernel.settings import Settings
from tests.providers.fake_embeddings import embed
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from worker.providers.embeddings import Embedder, EmbeddingFailed


def test_vectors_come_back_in_input_order_on_one_pooled_connection() -> None:
    with FakeProvider([Reply()]) as fake:
        emb = Embedder(fake.base_url, "fake-embed", timeout_s=5, api_key="sk-test")
        for _ in range(3):
            assert emb.embed(["b text", "a text"]) == [embed("b text"), embed("a text")]
        assert fake.connections == 1
        assert fake.seen[0].headers["authorization"] == "Bearer sk-test"
        assert fake.seen[0].request == {"model": "fake-embed", "input": ["b text", "a text"]}
        assert "sk-test" not in repr(emb)
        emb.http.close()


def _shuffled(request: dict[str, Any], n: int) -> Reply:
    data = [{"embedding": [float(i + 1)], "index": i} for i in range(len(request["input"]))]
    return Reply(body=json.dumps({"data": data[::-1], "usage": {}}))


def test_the_answer_is_put_back_in_input_order() -> None:
    with FakeProvider(_shuffled) as fake:
        emb = Embedder(fake.base_url, "m", timeout_s=5)
        assert emb.embed(["x", "y", "z"]) == [[1.0], [2.0], [3.0]]


@pytest.mark.parametrize(
    "reply, code",
    [
        (Reply(status=500), "embeddings_unavailable"),
        (Reply(status=429), "embeddings_unavailable"),
        (Reply(status=400), "embeddings_refused"),
        (Reply(body="not json"), "embeddings_malformed"),
        (Reply(body='{"data": [{"embedding": [1.0], "index": 0}]}'), "embeddings_malformed"),
        (
            Reply(body='{"data": [{"embedding": [], "index": 0}, {"embedding": [], "index": 1}]}'),
            "embeddings_malformed",
        ),
        (Reply(first_byte_s=30), "embeddings_timeout"),
    ],
    ids=["500", "429", "400", "not-json", "too-few", "empty", "hang"],
)
def test_every_failure_is_one_error_with_its_code(reply: Reply, code: str) -> None:
    with FakeProvider([reply]) as fake:
        emb = Embedder(fake.base_url, "m", timeout_s=0.5)
        with pytest.raises(EmbeddingFailed) as raised:
            emb.embed(["one", "two"])
        assert raised.value.code == code and isinstance(raised.value, ReinsError)
        assert (emb.calls, emb.failures) == (1, 1)


def test_a_server_that_is_not_there_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    emb = Embedder(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2)
    with pytest.raises(EmbeddingFailed) as raised:
        emb.embed(["x"])
    assert raised.value.code == "embeddings_unavailable"


def test_settings_configure_it_or_leave_it_off() -> None:
    assert Embedder.from_settings(Settings(), {}) is None
    s = Settings.from_env(
        {"REINS_EMBEDDINGS_URL": "http://127.0.0.1:9/v1", "REINS_EMBEDDINGS_API_KEY_ENV": "K"}
    )
    emb = Embedder.from_settings(s, {"K": "sk-x"})
    assert emb is not None and emb.model == "text-embedding-3-small" and emb.timeout_s == 2.0
    with pytest.raises(ConfigError, match="REINS_EMBEDDINGS_URL"):
        Settings.from_env({"REINS_EMBEDDINGS_URL": "ftp://host"})
    with pytest.raises(ConfigError, match="REINS_EMBEDDINGS_TIMEOUT_S"):
        Settings.from_env({"REINS_EMBEDDINGS_TIMEOUT_S": "0"})
    with pytest.raises(ConfigError, match="K is not set"):
        Embedder.from_settings(s, {})
