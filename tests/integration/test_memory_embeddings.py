"""Recall ranked by embeddings (issue 41 item 6), through the real loopback HTTP server's
``/v1/embeddings``: a fact whose words differ from the query's but whose embedding is near
ranks first with an embedder and not without; with no embedder, recall is exactly the text
index's; an embedder that answers 500 or hangs fails nothing (the text index alone, logged);
an erasure takes the vectors with the items."""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel.memory import MemoryKind, Visibility, recall
from store.memory_base import MemoryBank
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory
from store.redis_client import client_from_url
from tests.conftest import REDIS_URL
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from tests.support.raw_memory import mentions
from worker.memory_tools import MemoryBackend, call
from worker.providers.embeddings import Embedder

ANA = Visibility("acme", "cu_ana", "support")
BACKENDS = ["sqlite", pytest.param("redis", marks=pytest.mark.redis)]


@pytest.fixture(params=BACKENDS)
def bank(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryBank]:
    """An empty bank (its Redis keys deleted after)."""
    if request.param == "sqlite":
        made: MemoryBank = SqliteMemory(tmp_path / "m.db")
        yield made
        made.close()
        return
    prefix = f"reins-test-{uuid.uuid4().hex[:12]}"
    client = client_from_url(REDIS_URL)
    made = RedisMemory(client, prefix=prefix)
    yield made
    keys = list(client.scan_iter(match=f"{{{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


class Switch:
    """The server's script: answers normally, or as ``reply`` says once it is set."""

    def __init__(self) -> None:
        self.reply: Reply | None = None

    def __call__(self, request: dict[str, Any], n: int) -> Reply:
        return self.reply or Reply()


@pytest.fixture
def server() -> Iterator[tuple[FakeProvider, Switch]]:
    switch = Switch()
    with FakeProvider(switch) as fake:
        yield fake, switch


def remember(
    bank: MemoryBank, emb: Embedder | None, key: str, text: str, tags: list[str], t: float
) -> None:
    args = {"key": key, "value": text, "tags": tags}
    result, _ = call(bank, ANA, "remember_fact", args, t, None, emb)
    assert result["code"] == "remembered", result


def ask(
    bank: MemoryBank,
    emb: Embedder | None,
    tags: list[str],
    query: str | None = None,
    limit: int = 5,
) -> dict[str, Any]:
    args: dict[str, Any] = {"tags": tags, "limit": limit}
    if query is not None:
        args["query"] = query
    result, _ = call(bank, ANA, "recall_facts", args, 10_000.0, None, emb)
    return result


QUERY = "quick reimbursement for customers"
NEAR = "customer wants a fast reimbursing of orders"  # no word of QUERY's


def two_facts(bank: MemoryBank, emb: Embedder | None) -> None:
    """The near fact is older, so the text index alone (a tie on tags) puts the other first."""
    remember(bank, emb, "payout_speed", NEAR, ["refund"], 1)
    remember(bank, emb, "refund_policy", "manager approval above fifty euros", ["refund"], 2)


def test_a_near_fact_ranks_first_with_embeddings_and_not_without(
    bank: MemoryBank, server: tuple[FakeProvider, Switch]
) -> None:
    fake, _ = server
    emb = Embedder(fake.base_url, "fake-embed", timeout_s=5)
    two_facts(bank, emb)
    stored = bank.items("acme", MemoryKind.FACT)
    assert all(i.embedding for i in stored)  # each fact kept its vector
    with_emb = ask(bank, emb, ["refund"], QUERY)
    without = ask(bank, None, ["refund"], QUERY)
    assert [f["key"] for f in with_emb["facts"]] == ["payout_speed", "refund_policy"]
    assert with_emb["ranked_by"] == "embeddings"
    assert [f["key"] for f in without["facts"]] == ["refund_policy", "payout_speed"]
    # Asked for one, the text index's best candidates are re-ranked, not its best one alone.
    assert [f["key"] for f in ask(bank, emb, ["refund"], QUERY, limit=1)["facts"]] == [
        "payout_speed"
    ]
    assert not set(QUERY.split()) & set(NEAR.split())
    sent = [s for s in fake.seen if s.path == "/v1/embeddings"]
    assert len(sent) == 4 and sent[-1].request == {"model": "fake-embed", "input": [QUERY]}
    assert emb.failures == 0


def test_without_an_embedder_recall_is_exactly_the_text_index(
    bank: MemoryBank, server: tuple[FakeProvider, Switch], tmp_path: Path
) -> None:
    """The same facts written with vectors (``bank``) and without (a second bank): every
    recall without an embedder answers the same, and as the reference scan ranks."""
    fake, _ = server
    emb = Embedder(fake.base_url, "fake-embed", timeout_s=5)
    plain = SqliteMemory(tmp_path / "plain.db")
    rng = random.Random(41)
    vocab = [f"w{i}" for i in range(12)]
    for n in range(40):
        tags, text = rng.sample(vocab, 2), " ".join(rng.sample(vocab, 4))
        remember(bank, emb, f"k{n}", text, tags, 1 + n % 7)
        remember(plain, None, f"k{n}", text, tags, 1 + n % 7)
    assert all(i.embedding for i in bank.items("acme")) and not any(
        i.embedding for i in plain.items("acme")
    )
    for _ in range(25):
        tags = rng.sample(vocab, 2)
        answer = ask(bank, None, tags, "anything at all")
        assert answer == ask(plain, None, tags, "anything at all")
        assert "ranked_by" not in answer
        scan = recall(plain.items("acme"), ANA, MemoryKind.FACT, tags, 10_000_000, 5)
        assert [f["key"] for f in answer["facts"]] == [i.key for i in scan]
    plain.close()


@pytest.mark.parametrize(
    "fault, code",
    [(Reply(status=500), "embeddings_unavailable"), (Reply(first_byte_s=30), "embeddings_timeout")],
    ids=["http-500", "hang"],
)
def test_an_embedder_that_fails_or_hangs_falls_back_to_the_text_index(
    bank: MemoryBank,
    server: tuple[FakeProvider, Switch],
    fault: Reply,
    code: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, switch = server
    emb = Embedder(fake.base_url, "fake-embed", timeout_s=0.5)
    two_facts(bank, emb)
    switch.reply = fault
    with caplog.at_level(logging.WARNING, logger="worker.memory_tools"):
        answer = ask(bank, emb, ["refund"], QUERY)
        remember(bank, emb, "late", "written while the embedder is down", ["refund"], 3)
    assert answer["ranked_by"] == "text_fallback"
    assert [f["key"] for f in answer["facts"]] == ["refund_policy", "payout_speed"]  # as text
    late = [i for i in bank.items("acme") if i.key == "late"]
    assert len(late) == 1 and late[0].embedding is None  # stored, without a vector
    assert emb.failures == 2
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all(code in w for w in warned)


def test_erasure_erases_the_vectors_too(
    bank: MemoryBank, server: tuple[FakeProvider, Switch]
) -> None:
    fake, _ = server
    emb = Embedder(fake.base_url, "fake-embed", timeout_s=5)
    two_facts(bank, emb)
    vectors = [i.embedding for i in bank.items("acme")]
    assert all(vectors)
    needles = [v[:40] for v in vectors if v]  # a piece of each packed vector
    assert mentions(bank, needles) != []  # the raw store holds them
    erased = bank.erase_user("acme", "cu_ana")
    assert len(erased) == 2
    assert mentions(bank, needles) == []


def test_a_worker_backend_reports_each_fallback(
    bank: MemoryBank, server: tuple[FakeProvider, Switch]
) -> None:
    """What a worker counts (``reins_memory_embedding_fallbacks_total``): a recall whose
    embedder failed, and no other."""
    fake, switch = server
    told: list[str] = []
    emb = Embedder(fake.base_url, "fake-embed", timeout_s=5)
    inner: Any = None  # memory tools never reach the inner backend
    backend = MemoryBackend(
        inner, bank, "acme", "support", lambda: 100.0, embedder=emb, on_fallback=told.append
    )
    two_facts(bank, emb)
    recall_args = {"tags": ["refund"], "query": QUERY}
    result, _ = backend.call("cu_ana", "recall_facts", recall_args, "k1", 5.0, fence=1)
    assert result["ranked_by"] == "embeddings" and told == []
    switch.reply = Reply(status=503)
    result, _ = backend.call("cu_ana", "recall_facts", recall_args, "k2", 5.0, fence=1)
    assert result["ranked_by"] == "text_fallback" and told == ["acme"]
