"""The memory contract: every test runs against the dict, SQLite (FTS5) and the running Redis,
and every recall is compared with kernel.memory.recall, the plain scan over visible rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.errors import InvalidInput
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, recall
from store.memory_base import DictMemory, MemoryBank
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory
from store.redis_client import client_from_url
from tests.conftest import REDIS_URL

BACKENDS = [
    "dict",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]
FACT, EPISODE = MemoryKind.FACT, MemoryKind.EPISODE
NOW = 1_800_000_000_000

Factory = Callable[[], MemoryBank]


@pytest.fixture(params=BACKENDS)
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Makes empty banks of one backend; each is closed (and its Redis keys deleted) after."""
    made: list[MemoryBank] = []
    prefixes: list[str] = []
    url = REDIS_URL
    if request.param == "redis-cluster":  # one owner's keys share a slot: no CROSSSLOT
        url = request.getfixturevalue("redis_cluster_url")

    def make() -> MemoryBank:
        bank: MemoryBank
        if request.param == "dict":
            bank = DictMemory()
        elif request.param == "sqlite":
            bank = SqliteMemory(tmp_path / f"{uuid.uuid4().hex}.db")
        else:
            prefix = f"reins-test-{uuid.uuid4().hex[:12]}"
            prefixes.append(prefix)
            bank = RedisMemory(client_from_url(url), prefix=prefix)
        made.append(bank)
        return bank

    yield make
    for bank in made:
        bank.close()
    if prefixes:
        client = client_from_url(url)
        for prefix in prefixes:
            keys = list(client.scan_iter(match=f"{{{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
        client.close()


def fact(
    key: str,
    tags: list[str],
    *,
    tenant: str = "acme",
    scope: Scope = Scope.USER,
    subject: str = "cu_1",
    at: int = NOW,
    expires: int | None = None,
    kind: MemoryKind = FACT,
) -> MemoryItem:
    return MemoryItem(
        kind=kind,
        tenant=tenant,
        scope=scope,
        subject=subject if scope is not Scope.TENANT else "",
        key=key,
        value={"text": key},
        tags=tags,
        written_ms=at,
        expires_ms=expires,
    )


ACME_CU1 = Visibility("acme", "cu_1", "support")


def test_recall_ranks_by_overlap_then_recency(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("one", ["shipping"], at=NOW - 5))
    bank.put(fact("two", ["shipping", "refund"], at=NOW - 9))
    bank.put(fact("three", ["shipping"], at=NOW - 1))
    bank.put(fact("none", ["billing"], at=NOW))
    got = bank.recall(ACME_CU1, FACT, ["refund", "shipping"], NOW)
    assert [i.key for i in got] == ["two", "three", "one"]  # zero overlap is dropped


def test_a_put_replaces_the_item_and_its_old_tags(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("pref", ["email"]))
    bank.put(fact("pref", ["sms"], at=NOW + 1))
    assert bank.recall(ACME_CU1, FACT, ["email"], NOW + 2) == []
    [only] = bank.recall(ACME_CU1, FACT, ["sms"], NOW + 2)
    assert only.written_ms == NOW + 1
    assert len(bank.items("acme")) == 1


def test_an_expired_item_is_never_recalled(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("old", ["pref"], expires=NOW))
    bank.put(fact("live", ["pref"], expires=NOW + 1))
    assert [i.key for i in bank.recall(ACME_CU1, FACT, ["pref"], NOW)] == ["live"]


def test_facts_and_episodes_are_recalled_apart(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("f", ["refund"]))
    bank.put(fact("e", ["refund"], kind=EPISODE))
    assert [i.key for i in bank.recall(ACME_CU1, EPISODE, ["refund"], NOW)] == ["e"]
    assert [i.key for i in bank.recall(ACME_CU1, FACT, ["refund"], NOW)] == ["f"]


def test_reads_and_deletes_by_id_are_scoped_by_tenant(fresh: Factory) -> None:
    bank = fresh()
    mine = fact("secret", ["x"], tenant="acme")
    bank.put(mine)
    assert bank.get("globex", mine.item_id) is None
    assert bank.delete("globex", mine.item_id) is False
    assert bank.items("globex") == []
    assert bank.get("acme", mine.item_id) == mine
    assert bank.delete("acme", mine.item_id) is True
    assert bank.get("acme", mine.item_id) is None
    assert bank.recall(ACME_CU1, FACT, ["x"], NOW) == []


def test_erasing_a_user_removes_only_that_users_own_items(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("a", ["t"], subject="cu_1"))
    bank.put(fact("b", ["t"], subject="cu_1", kind=EPISODE))
    bank.put(fact("c", ["t"], subject="cu_2"))
    bank.put(fact("d", ["t"], scope=Scope.TENANT))
    assert bank.erase_user("acme", "cu_1") == 2
    assert sorted(i.key for i in bank.items("acme")) == ["c", "d"]


def test_a_bad_recall_is_refused_and_names_the_field(fresh: Factory) -> None:
    bank = fresh()
    with pytest.raises(InvalidInput, match="limit"):
        bank.recall(ACME_CU1, FACT, ["t"], NOW, limit=0)
    with pytest.raises(InvalidInput, match="tags"):
        bank.recall(ACME_CU1, FACT, [""], NOW)


# --- the seed's test, as a property: visibility is the retrieval predicate -------------------

TENANTS, USERS, AGENTS = ["acme", "globex"], ["cu_1", "cu_2"], ["support", "billing"]
VOCAB = [f"tag{i}" for i in range(8)]

items_st = st.builds(
    lambda kind, tenant, scope, user, agent, n, tags, at, exp: MemoryItem(
        kind=kind,
        tenant=tenant,
        scope=scope,
        subject={Scope.USER: user, Scope.AGENT: agent, Scope.TENANT: ""}[scope],
        key=f"k{n}",
        value={"n": n},
        tags=tags,
        written_ms=at,
        expires_ms=exp,
    ),
    st.sampled_from(MemoryKind),
    st.sampled_from(TENANTS),
    st.sampled_from(Scope),
    st.sampled_from(USERS),
    st.sampled_from(AGENTS),
    st.integers(0, 6),
    st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4),
    st.integers(0, 20),
    st.one_of(st.none(), st.integers(0, 30)),
)
visibility_st = st.builds(
    Visibility, st.sampled_from(TENANTS), st.sampled_from(USERS), st.sampled_from(AGENTS)
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    items=st.lists(items_st, min_size=1, max_size=25),
    caller=visibility_st,
    kind=st.sampled_from(MemoryKind),
    extra=st.lists(st.sampled_from(VOCAB), max_size=3),
    now=st.integers(0, 30),
    limit=st.integers(1, 30),
)
def test_no_recall_returns_an_item_its_caller_cannot_see(
    fresh: Factory,
    items: list[MemoryItem],
    caller: Visibility,
    kind: MemoryKind,
    extra: list[str],
    now: int,
    limit: int,
) -> None:
    bank = fresh()
    for item in items:
        bank.put(item)
    stored = {i.item_id: i for i in items}.values()  # a later put of the same id replaces
    # The query is crafted to match the items the caller may NOT see best of all.
    hidden = [i for i in stored if not caller.sees(i)]
    tags = sorted({t for i in hidden for t in i.tags} | set(extra)) or ["tag0"]
    got = bank.recall(caller, kind, tags, now, limit)
    assert all(caller.sees(i) for i in got), [i for i in got if not caller.sees(i)]
    assert got == recall(stored, caller, kind, tags, now, limit)
