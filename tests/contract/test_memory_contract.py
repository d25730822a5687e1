"""The memory contract: every test runs against the dict, SQLite (FTS5) and the running Redis,
and every recall is compared with kernel.memory.recall, the plain scan over visible rows."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.errors import InvalidInput
from kernel.memory import (
    MemoryItem,
    MemoryKind,
    Provenance,
    Scope,
    Source,
    Trust,
    Visibility,
    recall,
)
from store.memory_base import DictMemory, MemoryBank, Swept, due
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory
from store.redis_client import client_from_url
from tests.conftest import REDIS_URL
from tests.support.raw_memory import mentions

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
    concerns: tuple[str, ...] = (),
    calls: tuple[str, ...] = (),
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
        concerns=concerns,
        provenance=Provenance(source=Source.TOOL_RESULT, trust=Trust.UNTRUSTED, call_ids=calls)
        if calls
        else None,
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


def test_erasing_a_user_removes_every_item_that_concerns_them_from_the_raw_store(
    fresh: Factory,
) -> None:
    bank = fresh()
    mine = [
        fact("a", ["t"], subject="cu_1", concerns=("cu_1",)),
        fact("b", ["t"], subject="cu_1", kind=EPISODE),  # written before concerns: its owner
        fact("c", ["t"], scope=Scope.TENANT, concerns=("cu_1",), calls=("call-1",)),
        fact("d", ["t"], scope=Scope.AGENT, subject="support", kind=EPISODE, concerns=("cu_1",)),
        fact("e", ["t"], subject="cu_2", concerns=("cu_2", "cu_1")),  # names cu_1 too
    ]
    theirs = [
        fact("f", ["t"], subject="cu_2", concerns=("cu_2",)),
        fact("g", ["t"], scope=Scope.TENANT, concerns=("cu_2",), calls=("call-2",)),
        fact("h", ["t"], tenant="globex", concerns=("cu_1",)),  # another tenant's cu_1
    ]
    for item in mine + theirs:
        bank.put(item)
    erased = bank.erase_user("acme", "cu_1")
    assert sorted(i.key for i in erased) == ["a", "b", "c", "d", "e"]
    assert sorted(i.key for i in bank.items("acme")) == ["f", "g"]
    assert bank.concerning("acme", "cu_1") == []
    assert [i.key for i in bank.items("globex")] == ["h"]
    # Nothing of the erased items is left in any table, key or index: ids, the user's own
    # sets, the source index of call-1 (only c came from it), expiry and time sets.
    gone = [i.item_id for i in mine] + ["call-1"]
    assert mentions(bank, gone) == []
    assert bank.erase_user("acme", "cu_1") == []  # again: nothing more


def test_an_item_written_again_is_filed_under_its_new_users_and_calls_only(
    fresh: Factory,
) -> None:
    bank = fresh()
    bank.put(fact("x", ["t"], scope=Scope.TENANT, concerns=("cu_1",), calls=("call-1",)))
    bank.put(
        fact("x", ["t"], scope=Scope.TENANT, concerns=("cu_2",), calls=("call-2",), at=NOW + 1)
    )
    assert bank.concerning("acme", "cu_1") == []
    assert bank.from_source("acme", "call-1") == []
    assert bank.erase_user("acme", "cu_1") == []
    [kept] = bank.items("acme")
    assert kept.concerns == ("cu_2",)
    assert [i.key for i in bank.erase_source("acme", "call-2")] == ["x"]
    assert bank.items("acme") == []


def test_removal_by_source_takes_exactly_what_that_call_shaped(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("p", ["t"], scope=Scope.TENANT, calls=("call-1",)))
    bank.put(fact("q", ["t"], calls=("call-1", "call-2")))
    bank.put(fact("r", ["t"], calls=("call-2",)))
    bank.put(fact("s", ["t"]))
    assert bank.erase_source("globex", "call-1") == []  # another tenant's call: nothing
    assert sorted(i.key for i in bank.erase_source("acme", "call-1")) == ["p", "q"]
    assert sorted(i.key for i in bank.items("acme")) == ["r", "s"]
    assert bank.from_source("acme", "call-2")[0].key == "r"


def test_a_sweep_deletes_expired_and_retained_out_items_from_the_raw_store(
    fresh: Factory,
) -> None:
    bank = fresh()
    day = 86_400_000
    expired = fact("expired", ["t"], at=NOW - 10, expires=NOW, concerns=("cu_1",))
    old = fact("old", ["t"], kind=EPISODE, at=NOW - 30 * day, calls=("call-9",))
    live = fact("live", ["t"], at=NOW - 10, expires=NOW + 1)
    young = fact("young", ["t"], kind=EPISODE, at=NOW - 30 * day + 1)
    for item in (expired, old, live, young):
        bank.put(item)
    assert bank.sweep("globex", NOW, 30 * day, 10) == Swept(0, False)
    assert bank.sweep("acme", NOW, 30 * day, 10) == Swept(2, False)
    assert sorted(i.key for i in bank.items("acme")) == ["live", "young"]
    assert bank.get("acme", expired.item_id) is None
    assert mentions(bank, [expired.item_id, old.item_id, "call-9"]) == []
    assert bank.sweep("acme", NOW, None, 10) == Swept(0, False)  # no retention: none is due


def test_a_sweep_is_bounded_and_says_when_more_is_due(fresh: Factory) -> None:
    bank = fresh()
    for n in range(5):
        bank.put(fact(f"k{n}", ["t"], at=NOW - 10, expires=NOW - n))
    first = bank.sweep("acme", NOW, None, 3)
    assert first == Swept(3, True)
    assert len(bank.items("acme")) == 2
    assert bank.sweep("acme", NOW, None, 3) == Swept(2, False)
    assert bank.items("acme") == []


def test_a_sweep_keeps_an_item_written_again_with_a_later_expiry(fresh: Factory) -> None:
    bank = fresh()
    bank.put(fact("pref", ["t"], at=NOW - 10, expires=NOW - 1))
    bank.put(fact("pref", ["t"], at=NOW - 5, expires=NOW + 100))
    assert bank.sweep("acme", NOW, None, 10) == Swept(0, False)
    [kept] = bank.items("acme")
    assert kept.expires_ms == NOW + 100


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


concern_items_st = st.builds(
    lambda base, users, calls: base.model_copy(
        update={
            "concerns": tuple(sorted(set(users))),
            "provenance": Provenance(
                source=Source.MODEL, trust=Trust.TRUSTED, call_ids=tuple(sorted(set(calls)))
            ),
        }
    ),
    items_st,
    st.lists(st.sampled_from([*USERS, "cu_3"]), max_size=2),
    st.lists(st.sampled_from(["call-1", "call-2"]), max_size=2),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    items=st.lists(concern_items_st, min_size=1, max_size=20),
    tenant=st.sampled_from(TENANTS),
    user=st.sampled_from(USERS),
    now=st.integers(0, 30),
    keep=st.one_of(st.none(), st.integers(1, 20)),
)
def test_erasure_and_sweeps_find_exactly_what_a_scan_finds(
    fresh: Factory,
    items: list[MemoryItem],
    tenant: str,
    user: str,
    now: int,
    keep: int | None,
) -> None:
    bank = fresh()
    for item in items:
        bank.put(item)
    stored = list({i.item_id: i for i in items}.values())  # a later put of the same id replaces
    ours = [i for i in stored if i.tenant == tenant]
    concerning = {i.item_id for i in ours if i.concerns_user(user)}
    assert {i.item_id for i in bank.concerning(tenant, user)} == concerning
    assert {i.item_id for i in bank.from_source(tenant, "call-1")} == {
        i.item_id for i in ours if "call-1" in i.call_ids
    }
    assert {i.item_id for i in bank.erase_user(tenant, user)} == concerning
    left = [i for i in ours if i.item_id not in concerning]
    assert sorted(i.item_id for i in bank.items(tenant)) == sorted(i.item_id for i in left)
    due_ids = {i.item_id for i in left if due(i, now, keep)}
    swept = bank.sweep(tenant, now, keep, 100)
    assert swept == Swept(len(due_ids), False)
    remaining = sorted(i.item_id for i in left if i.item_id not in due_ids)
    assert sorted(i.item_id for i in bank.items(tenant)) == remaining


@pytest.mark.redis
def test_a_redis_sweep_that_read_a_stale_page_keeps_the_item_written_since(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    # The sweep reads due ids, then deletes each in scripts of its own: an item written again
    # in between (here: never due) must survive both the item's script and the index's.
    bank = RedisMemory(redis_client, prefix=key_prefix)
    live = fact("pref", ["t"], at=NOW - 5, expires=NOW + 100, concerns=("cu_1",))
    bank.put(live)
    assert bank._delete_ids("acme", [live.item_id], NOW, -1) == []
    assert bank.get("acme", live.item_id) == live
    assert [i.key for i in bank.concerning("acme", "cu_1")] == ["pref"]
    assert bank.sweep("acme", NOW + 100, None, 10) == Swept(1, False)


@pytest.mark.redis
def test_redis_items_written_before_the_indexes_are_filed_and_swept(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    # What 0.2 wrote: the item, and an id entry that is a bare [scope, subject], filed in no
    # expiry or time set. The sweep files a page of them and then deletes what is due.
    bank = RedisMemory(redis_client, prefix=key_prefix)
    old = [fact(f"old{n}", ["t"], at=NOW - 10, expires=NOW - 1) for n in range(5)]
    kept = fact("kept", ["t"], at=NOW - 10, expires=NOW + 100)
    stem = bank.tenant_stem("acme")
    for item in [*old, kept]:
        bank.put(item)
        redis_client.hset(bank.ids_key("acme"), item.item_id, '["user", "cu_1"]')
        redis_client.zrem(f"{stem}x", item.item_id)
        redis_client.zrem(f"{stem}w", item.item_id)
    swept = 0
    for _ in range(10):
        swept += bank.sweep("acme", NOW, None, 2).deleted
    assert swept == 5
    assert [i.key for i in bank.items("acme")] == ["kept"]
    assert redis_client.get(f"{stem}filed") == b"done"
