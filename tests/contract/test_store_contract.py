"""The store contract: every test here runs against memory, SQLite, the running Redis and a
three-master Redis Cluster of the session's own, where a script or a multi-key command over two
hash slots fails with ``CROSSSLOT``."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel.errors import (
    ConcurrentModification,
    CorruptSnapshot,
    InvalidInput,
    SnapshotExists,
    SnapshotNotFound,
    StoreError,
    UnsupportedSchema,
)
from kernel.record import OpStatus
from kernel.states import LifecycleState
from store.base import TrajectoryStore, prepare_commit
from store.in_process import InProcessStore
from store.redis_client import client_from_url
from store.redis_keys import COMMITS_KEPT
from store.redis_store import RedisStore
from store.sqlite import SqliteStore
from tests.conftest import REDIS_URL
from tests.contract.advance_worker import (
    advance,
    make_record,
    next_version,
    row_for,
    with_open_call,
)

ROOT = Path(__file__).resolve().parents[2]
S = LifecycleState
BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
]


@dataclass
class Backend:
    """A store under test, with a way to read and damage its stored bytes directly."""

    name: str
    store: TrajectoryStore
    spec: str | None  # how another process opens the same store; None for memory
    raw: Callable[[str, str], bytes | None]
    poke: Callable[[str, str, bytes], None]
    url: str = ""  # a Redis backend's server


def _memory() -> Backend:
    store = InProcessStore()

    def raw(tenant: str, tid: str) -> bytes | None:
        found = store._trajectories.get((tenant, tid))
        return None if found is None else found.snapshot

    def poke(tenant: str, tid: str, data: bytes) -> None:
        store._trajectories[(tenant, tid)].snapshot = data

    return Backend("memory", store, None, raw, poke)


def _sqlite(path: Path) -> Backend:
    where = "WHERE tenant = ? AND trajectory_id = ?"

    def raw(tenant: str, tid: str) -> bytes | None:
        with sqlite3.connect(path) as conn:
            row = conn.execute(f"SELECT data FROM snapshots {where}", (tenant, tid)).fetchone()
        return None if row is None else bytes(row[0])

    def poke(tenant: str, tid: str, data: bytes) -> None:
        with sqlite3.connect(path) as conn:
            conn.execute(f"UPDATE snapshots SET data = ? {where}", (data, tenant, tid))

    return Backend("sqlite", SqliteStore(path), f"sqlite:{path}", raw, poke)


def _redis(prefix: str, url: str = REDIS_URL, name: str = "redis") -> Backend:
    store = RedisStore(client_from_url(url), prefix=prefix)
    client = client_from_url(url)

    def raw(tenant: str, tid: str) -> bytes | None:
        value = client.hget(store.trajectory_keys(tenant, tid)[0], "data")
        return value if isinstance(value, bytes) else None

    def poke(tenant: str, tid: str, data: bytes) -> None:
        client.hset(store.trajectory_keys(tenant, tid)[0], "data", data)

    return Backend(name, store, f"redis:{url}|{prefix}", raw, poke, url)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "memory":
        made = _memory()
    elif request.param == "sqlite":
        made = _sqlite(tmp_path / "reins.db")
    elif request.param == "redis":
        made = _redis(request.getfixturevalue("key_prefix"))
    else:
        url = request.getfixturevalue("redis_cluster_url")
        made = _redis(request.getfixturevalue("cluster_key_prefix"), url, "redis-cluster")
    yield made
    made.store.close()


@pytest.fixture
def store(backend: Backend) -> TrajectoryStore:
    return backend.store


# --- create and load --------------------------------------------------------------------------


def test_create_then_load_returns_an_equal_record(store: TrajectoryStore) -> None:
    rec = make_record()
    assert store.create(rec) == 1
    assert store.load("acme", "t1") == rec
    assert store.list("acme") == ["t1"]


def test_create_refuses_an_existing_trajectory_and_changes_nothing(backend: Backend) -> None:
    store = backend.store
    store.create(make_record())
    before = backend.raw("acme", "t1")
    other = make_record().model_copy(update={"goal": "something else"})
    with pytest.raises(SnapshotExists, match=r"t1 already exists \(at version 1\)") as caught:
        store.create(other)
    assert isinstance(caught.value, ConcurrentModification)
    assert backend.raw("acme", "t1") == before


def test_the_same_id_in_two_tenants_is_two_trajectories(store: TrajectoryStore) -> None:
    store.create(make_record(tenant="acme"))
    store.create(make_record(tenant="globex").model_copy(update={"goal": "g2"}))
    assert store.load("globex", "t1").goal == "g2"
    assert store.load("acme", "t1").goal == "refund ord_1001"
    assert store.list("acme") == store.list("globex") == ["t1"]


def test_a_wrong_tenant_sees_no_trajectory(store: TrajectoryStore) -> None:
    store.create(make_record(tenant="acme"))
    with pytest.raises(SnapshotNotFound, match="trajectory t1 not found in tenant globex"):
        store.load("globex", "t1")
    assert store.list("globex") == []
    assert store.read("globex", "t1") == []
    assert store.committed("globex", "t1", 1) is None


def test_ids_with_separators_do_not_collide(store: TrajectoryStore) -> None:
    store.create(make_record(tid="c", tenant="a:b"))
    store.create(make_record(tid="b:c", tenant="a"))
    assert store.load("a:b", "c").tenant == "a:b"
    assert store.load("a", "b:c").trajectory_id == "b:c"
    assert store.list("a") == ["b:c"]


# --- compare-and-set --------------------------------------------------------------------------


def test_compare_and_set_advances_and_returns_the_new_version(store: TrajectoryStore) -> None:
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    assert store.compare_and_set(v2, 1, [row_for(v2, 0)]) == 2
    v5 = next_version(v2, LifecycleState.READY, step=3)  # a version may jump
    assert store.compare_and_set(v5, 2) == 5
    assert store.load("acme", "t1") == v5
    assert [row.index for row in store.read("acme", "t1")] == [0]


def test_a_stale_writer_loses_and_learns_the_current_version(backend: Backend) -> None:
    store = backend.store
    rec = make_record()
    store.create(rec)
    first, second = store.load("acme", "t1"), store.load("acme", "t1")
    winner = next_version(first, LifecycleState.CALLING_MODEL)
    store.compare_and_set(winner, 1, [row_for(winner, 0, "a")])
    loser = next_version(second, LifecycleState.WAITING_TOOL)
    with pytest.raises(ConcurrentModification) as caught:
        store.compare_and_set(loser, 1, [row_for(loser, 0, "b")])
    assert (caught.value.expected_version, caught.value.current_version) == (1, 2)
    assert "t1" in str(caught.value)
    assert store.load("acme", "t1") == winner
    assert [row.detail for row in store.read("acme", "t1")] == [{"writer": "a"}]
    assert store.list("acme", LifecycleState.WAITING_TOOL) == []


def test_compare_and_set_on_a_missing_trajectory_is_not_found(store: TrajectoryStore) -> None:
    with pytest.raises(SnapshotNotFound, match="trajectory t9 not found in tenant acme"):
        store.compare_and_set(next_version(make_record("t9")), 1)


def test_a_repeated_commit_id_applies_once(store: TrajectoryStore) -> None:
    rec = make_record()
    store.create(rec, commit_id="c-1")
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    assert store.compare_and_set(v2, 1, [row_for(v2, 0)], commit_id="c-2") == 2
    assert store.compare_and_set(v2, 1, [row_for(v2, 0)], commit_id="c-2") == 2
    assert len(store.read("acme", "t1")) == 1
    assert (store.committed("acme", "t1", 1), store.committed("acme", "t1", 2)) == ("c-1", "c-2")
    with pytest.raises(ConcurrentModification):  # same version, another commit: a real loss
        store.compare_and_set(v2, 1, [row_for(v2, 0)], commit_id="c-other")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("version_not_above", "must be above the expected version"),
        ("row_of_other_trajectory", "belongs to trajectory t2"),
        ("row_with_other_version", "carries version 9"),
        ("row_of_the_stored_version", "carries version 2"),
        ("rows_going_back_a_version", "carries version 3, the commit writes versions 4 to 4"),
        ("rows_not_consecutive", "not consecutive"),
        ("rows_leave_a_gap", "start at index 5 but the chain holds 1 rows"),
        ("rows_rewrite_history", "start at index 0 but the chain holds 1 rows"),
    ],
)
def test_a_malformed_commit_changes_nothing(backend: Backend, case: str, message: str) -> None:
    store = backend.store
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    store.compare_and_set(v2, 1, [row_for(v2, 0)])
    before = (backend.raw("acme", "t1"), store.read("acme", "t1"), store.list("acme", None))
    v3 = next_version(v2, LifecycleState.WAITING_TOOL)
    args = {
        "version_not_above": (v2, 2, []),
        "row_of_other_trajectory": (v3, 2, [row_for(make_record("t2"), 1)]),
        "row_with_other_version": (v3, 2, [row_for(next_version(v3, step=6), 1)]),
        "row_of_the_stored_version": (v3, 2, [row_for(v2, 1)]),
        "rows_going_back_a_version": (
            next_version(v3),
            2,
            [row_for(next_version(v3), 1), row_for(v3, 2)],
        ),
        "rows_not_consecutive": (v3, 2, [row_for(v3, 1), row_for(v3, 3)]),
        "rows_leave_a_gap": (v3, 2, [row_for(v3, 5)]),
        "rows_rewrite_history": (v3, 2, [row_for(v3, 0)]),
    }[case]
    with pytest.raises(InvalidInput, match=message):
        store.compare_and_set(*args)
    after = (backend.raw("acme", "t1"), store.read("acme", "t1"), store.list("acme", None))
    assert after == before
    assert store.list("acme", LifecycleState.WAITING_TOOL) == []
    assert store.committed("acme", "t1", 3) is None


def test_steps_committed_as_one_keep_their_rows_versions(store: TrajectoryStore) -> None:
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.READY)
    v3 = next_version(v2, LifecycleState.CALLING_MODEL)
    assert store.compare_and_set(v3, 1, [row_for(v2, 0), row_for(v3, 1)]) == 3
    assert store.load("acme", "t1") == v3
    assert [row.record_version for row in store.read("acme", "t1")] == [2, 3]
    with pytest.raises(ConcurrentModification):
        store.compare_and_set(next_version(v3, step=2), 2, [row_for(next_version(v3), 2)])


def test_the_state_index_follows_every_commit(store: TrajectoryStore) -> None:
    for tid in ("t1", "t2", "t3"):
        store.create(make_record(tid))
    store.create(make_record("t1", tenant="globex"))
    t2 = store.load("acme", "t2")
    store.compare_and_set(next_version(t2, LifecycleState.CALLING_MODEL), 1)
    assert store.list("acme", LifecycleState.READY) == ["t1", "t3"]
    assert store.list("acme", LifecycleState.CALLING_MODEL) == ["t2"]
    t2 = store.load("acme", "t2")
    store.compare_and_set(next_version(t2, LifecycleState.COMPLETED), 2)
    assert store.list("acme", LifecycleState.CALLING_MODEL) == []
    assert store.list("acme", LifecycleState.COMPLETED) == ["t2"]
    assert store.list("acme") == ["t1", "t2", "t3"]
    assert store.list("globex", LifecycleState.READY) == ["t1"]
    for tenant in ("acme", "globex", "initech"):
        for state in (None, *LifecycleState):
            assert store.count(tenant, state) == len(store.list(tenant, state)), (tenant, state)
    assert store.count("acme", LifecycleState.READY) == 2 and store.count("acme") == 3


def test_the_owing_list_holds_exactly_the_ended_runs_with_an_open_operation(
    store: TrajectoryStore,
) -> None:
    for tid in ("t1", "t2", "t3"):
        store.create(make_record(tid))
    store.create(make_record("t1", tenant="globex"))
    live = next_version(with_open_call(store.load("acme", "t1"), OpStatus.REGISTERED))
    store.compare_and_set(live, 1)
    ended = S.CANCELED
    for tid in ("t2", "t3"):
        owes = next_version(with_open_call(store.load("acme", tid), OpStatus.UNKNOWN), ended)
        store.compare_and_set(owes, 1)
    assert store.owing("acme") == ["t2", "t3"], "a live run's open call is the kernel's"
    assert store.owing("acme", limit=1) == ["t2"]
    assert store.owing("globex") == [] and store.owing("initech") == []
    t2 = store.load("acme", "t2")
    store.compare_and_set(next_version(with_open_call(t2, OpStatus.SETTLED)), 2)
    assert store.owing("acme") == ["t3"], "settled: no longer owed"
    t3 = store.load("acme", "t3")
    with pytest.raises(ConcurrentModification):  # a lost race changes the list no more
        store.compare_and_set(next_version(with_open_call(t3, OpStatus.SETTLED)), 1)
    assert store.owing("acme") == ["t3"]


@pytest.mark.parametrize("limit", [1, 2, 3, 50])
def test_pages_of_a_state_cover_its_index_once(store: TrajectoryStore, limit: int) -> None:
    ids = [f"t{i}" for i in range(7)] + ["a:b", "z%2F"]
    for tid in ids:
        store.create(make_record(tid))
    moved = store.load("acme", "t3")
    store.compare_and_set(next_version(moved, LifecycleState.CALLING_MODEL), 1)
    seen: list[str] = []
    after = ""
    while True:
        page = store.page("acme", LifecycleState.READY, after, limit)
        assert len(page) <= limit
        seen += page
        if len(page) < limit:
            break
        after = page[-1]
    assert sorted(seen) == sorted(store.list("acme", LifecycleState.READY))
    assert len(seen) == len(set(seen)) == len(ids) - 1 and "t3" not in seen
    assert store.page("acme", LifecycleState.CALLING_MODEL, "", limit) == ["t3"]
    assert store.page("globex", LifecycleState.READY, "", limit) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_walk_finds_every_id_that_stays_however_the_index_churns(
    store: TrajectoryStore, seed: int
) -> None:
    """Between pages ids leave the state (before and after the walk's place) and new ones
    arrive: each id in the state all through the walk is returned once, none twice."""
    rng = random.Random(seed)
    ready = {f"r{rng.randrange(10**6):06d}-{i}" for i in range(60)}
    for tid in ready:
        store.create(make_record(tid))
    stayed, seen, after, made = set(ready), [], "", 0
    while True:
        page = store.page("acme", LifecycleState.READY, after, 4)
        seen += page
        if len(page) < 4:
            break
        after = page[-1]
        for tid in rng.sample(sorted(ready), min(2, len(ready))):  # leave READY
            store.compare_and_set(
                next_version(store.load("acme", tid), LifecycleState.CALLING_MODEL), 1
            )
            ready.discard(tid)
            stayed.discard(tid)
        made += 1
        for tid in (f"n{made:03d}", f"{rng.randrange(10**6):06d}-new"):  # arrive anywhere
            store.create(make_record(tid))
            ready.add(tid)
    assert len(seen) == len(set(seen)), "an id returned twice"
    assert stayed <= set(seen), f"skipped: {sorted(stayed - set(seen))}"
    assert len(stayed) > 10, "the churn left enough ids to test"


def test_the_chain_is_append_only_and_gapless(store: TrajectoryStore) -> None:
    rec = make_record()
    store.create(rec)
    index = 0
    for _ in range(4):
        nxt = next_version(rec)
        rows = [row_for(nxt, index), row_for(nxt, index + 1)]
        store.compare_and_set(nxt, rec.record_version, rows)
        rec, index = nxt, index + 2
    rows = store.read("acme", "t1")
    assert [r.index for r in rows] == list(range(8))
    assert [r.record_version for r in rows] == [2, 2, 3, 3, 4, 4, 5, 5]
    assert [r.index for r in store.read("acme", "t1", start=6)] == [6, 7]


# --- idempotency ledger -----------------------------------------------------------------------


def test_the_ledger_keeps_the_first_result(store: TrajectoryStore) -> None:
    assert store.lookup("acme", "t1:s2") is None
    first = {"refund_id": "rf_1", "amount_cents": 3000}
    assert store.record("acme", "t1:s2", first) == first
    assert store.record("acme", "t1:s2", {"refund_id": "rf_2"}) == first
    assert store.lookup("acme", "t1:s2") == first
    assert store.lookup("globex", "t1:s2") is None
    assert store.record("globex", "t1:s2", {"refund_id": "rf_9"}) == {"refund_id": "rf_9"}


def test_the_ledger_refuses_a_result_that_is_not_json(store: TrajectoryStore) -> None:
    with pytest.raises(InvalidInput, match="idempotency key k1"):
        store.record("acme", "k1", {"when": object()})
    assert store.lookup("acme", "k1") is None


# --- bad snapshots on load --------------------------------------------------------------------


def _schema_99() -> bytes:
    raw = json.loads(make_record().to_json())
    raw["schema_version"] = 99
    return json.dumps(raw).encode()


def _other_tenant() -> bytes:
    return make_record(tenant="globex").to_json()


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda: b'{"schema_version": 1, "trajectory_id": "t1", ', CorruptSnapshot, "not JSON"),
        (lambda: b"[1, 2]", CorruptSnapshot, "no schema_version"),
        (lambda: b'{"schema_version": 1}', CorruptSnapshot, "does not validate"),
        (_schema_99, UnsupportedSchema, "schema version 99"),
        (_other_tenant, CorruptSnapshot, "names trajectory t1 of tenant globex"),
        (
            lambda: make_record().model_copy(update={"record_version": 7}).to_json(),
            CorruptSnapshot,
            "stored at version 1 but the snapshot says 7",
        ),
    ],
)
def test_a_bad_snapshot_is_refused_by_name_and_left_as_is(
    backend: Backend,
    damage: Callable[[], bytes],
    error: type[Exception],
    message: str,
) -> None:
    store = backend.store
    store.create(make_record())
    bad = damage()
    backend.poke("acme", "t1", bad)
    for _ in range(2):
        with pytest.raises(error, match=message) as caught:
            store.load("acme", "t1")
        assert "trajectory t1 in tenant acme" in str(caught.value)
    assert store.list("acme") == ["t1"]
    assert backend.raw("acme", "t1") == bad


# --- concurrency ------------------------------------------------------------------------------


def _check_history(store: TrajectoryStore, counts: dict[str, dict[str, int]], total: int) -> None:
    """Exactly ``total`` commits, one chain row each, each writer's rows equal to its wins."""
    assert sum(c["wins"] for c in counts.values()) == total
    assert store.load("acme", "t1").record_version == 1 + total
    rows = store.read("acme", "t1")
    assert [r.index for r in rows] == list(range(total))
    assert all(r.record_version == r.index + 2 for r in rows)
    by_writer = Counter((r.detail or {}).get("writer") for r in rows)
    assert by_writer == {writer: c["wins"] for writer, c in counts.items() if c["wins"]}
    for c in counts.values():  # every lost race raised, naming a newer version
        assert c["stale_reports"] == c["conflicts"]
    assert sum(c["conflicts"] for c in counts.values()) > 0


@pytest.mark.slow
def test_eight_threads_advance_one_trajectory_exactly_4000_times(backend: Backend) -> None:
    store = backend.store
    store.create(make_record())
    counts: dict[str, dict[str, int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work(writer: str) -> None:
        start.wait()
        try:
            counts[writer] = advance(store, "acme", "t1", 500, writer)
        except BaseException as exc:  # surfaced below, with the thread's own error
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _check_history(store, counts, 4000)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ],
    indirect=True,
)
def test_four_processes_advance_one_trajectory_exactly_2000_times(backend: Backend) -> None:
    store = backend.store
    assert backend.spec is not None
    store.create(make_record())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.contract.advance_worker", backend.spec, "acme", "t1"]
    procs = [
        subprocess.Popen(
            [*command, "500", f"p{i}"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for proc in procs:  # each has opened the store
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in procs:  # the common start line
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        counts = {}
        for i, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out
            counts[f"p{i}"] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    _check_history(store, counts, 2000)


# --- the Redis backends: commands written before a commit -------------------------------------


@pytest.mark.parametrize(
    "backend",
    [pytest.param("redis", marks=pytest.mark.redis), "redis-cluster"],
    indirect=True,
)
def test_commands_before_a_commit_are_in_place_before_it(backend: Backend) -> None:
    """As a worker's follow-on turn writes its custody (keys of other slots on a cluster)."""
    store = backend.store
    assert isinstance(store, RedisStore)
    custody, members = f"{store.prefix}:custody:w1", f"{store.prefix}:custody-members"
    rec = make_record()
    store.create(rec)
    v2 = next_version(rec, LifecycleState.CALLING_MODEL)
    before = [("HSET", custody, "acme/t1", "2"), ("SADD", members, "w1")]
    assert store.apply(prepare_commit(v2, 1, [row_for(v2, 0)]), before=before) == 2
    client = client_from_url(backend.url)
    assert client.hget(custody, "acme/t1") == b"2" and client.sismember(members, "w1")
    client.set(f"{store.prefix}:a-string", "x")
    v3 = next_version(v2, LifecycleState.READY)
    wrong = [("HSET", f"{store.prefix}:a-string", "f", "v")]  # WRONGTYPE: no commit after it
    with pytest.raises(StoreError, match="WRONGTYPE"):  # raised whatever became of the commit
        store.apply(prepare_commit(v3, 2), before=wrong)
    if backend.name == "redis-cluster":  # answered before the commit was sent: none was
        assert store.load("acme", "t1") == v2 and store.list("acme", LifecycleState.READY) == []
    client.close()


@pytest.mark.parametrize(
    "backend",
    [pytest.param("redis", marks=pytest.mark.redis), "redis-cluster"],
    indirect=True,
)
def test_commit_ids_are_trimmed_to_the_last_few_and_a_recent_repeat_is_still_seen(
    backend: Backend,
) -> None:
    store = backend.store
    assert isinstance(store, RedisStore)
    client = client_from_url(backend.url)
    snap_key = store.trajectory_keys("acme", "t1")[0]
    rec = make_record()
    store.create(rec, commit_id="c-1")
    commits = {}
    for version in range(2, 31):
        nxt = next_version(rec)
        commits[version] = prepare_commit(nxt, rec.record_version, commit_id=f"c-{version}")
        assert store.apply(commits[version]) == version
        rec = nxt
        assert client.hlen(snap_key) == 3 + min(version, COMMITS_KEPT), version  # v, s, data
    assert [store.committed("acme", "t1", v) for v in range(1, 31)] == [None] * (
        30 - COMMITS_KEPT
    ) + [f"c-{v}" for v in range(31 - COMMITS_KEPT, 31)]
    for version in (30, 31 - COMMITS_KEPT):  # a resend of a commit whose reply was lost
        assert store.apply(commits[version]) == version
    assert store.load("acme", "t1") == rec and client.hlen(snap_key) == 3 + COMMITS_KEPT
    jumped = next_version(rec, step=70)  # a version may jump: no id below 100 - kept is left
    store.compare_and_set(jumped, 30, commit_id="c-100")
    assert sorted(client.hkeys(snap_key)) == [b"c100", b"data", b"s", b"v"]
    client.close()
