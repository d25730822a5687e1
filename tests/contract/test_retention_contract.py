"""Retention's contract: ``retire`` and the retention sweep on memory, SQLite and the running
Redis. What is retired is gone from the record, the chain, the commit ids and every index; what
is live, still owing or not yet expired stays; a commit that races a retire wins."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernel.errors import ConcurrentModification, SnapshotNotFound
from kernel.record import OpStatus, TrajectoryRecord
from kernel.states import LifecycleState
from router.process.retention import DAY_S, RetentionSweep
from store.base import Retirement, TrajectoryStore
from store.in_process import InProcessStore
from store.redis_client import client_from_url
from store.redis_store import RedisStore
from store.sqlite import SqliteStore
from tests.conftest import REDIS_URL
from tests.contract.advance_worker import make_record, next_version, row_for, with_open_call

S = LifecycleState
BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),  # retire's scripts keep to one slot
]
NOW = 100 * DAY_S  # the injected clock: day 100
KEEP_S = 30 * DAY_S


@dataclass
class Backend:
    """A store under test, and what is left of a trajectory where it keeps it (empty: none)."""

    store: TrajectoryStore
    leftovers: Callable[[str, str], list[str]]


def _memory() -> Backend:
    store = InProcessStore()

    def leftovers(tenant: str, tid: str) -> list[str]:
        found = [] if (tenant, tid) not in store._trajectories else ["record"]
        found += [f"index {s}" for s, ids in store._index.get(tenant, {}).items() if tid in ids]
        return found + (["owing"] if tid in store._owing.get(tenant, ()) else [])

    return Backend(store, leftovers)


def _sqlite(path: Path) -> Backend:
    def leftovers(tenant: str, tid: str) -> list[str]:
        with sqlite3.connect(path) as conn:
            return [
                table
                for table in ("snapshots", "commits", "chain", "owing")
                if conn.execute(
                    f"SELECT COUNT(*) FROM {table} WHERE tenant = ? AND trajectory_id = ?",
                    (tenant, tid),
                ).fetchone()[0]
            ]

    return Backend(SqliteStore(path), leftovers)


def _redis(prefix: str, url: str = REDIS_URL) -> Backend:
    store = RedisStore(client_from_url(url), prefix=prefix)
    client = client_from_url(url)

    def leftovers(tenant: str, tid: str) -> list[str]:
        snap_key, chain_key = store.trajectory_keys(tenant, tid)
        found = [key for key in (snap_key, chain_key) if client.exists(key)]
        found += [k for k in store.index_keys(tenant) if client.zscore(k, tid) is not None]
        found += [k for k in store.owing_keys(tenant) if client.zscore(k, tid) is not None]
        return found

    return Backend(store, leftovers)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    builders: dict[str, Callable[[], Backend]] = {
        "memory": _memory,
        "sqlite": lambda: _sqlite(tmp_path / "reins.db"),
        "redis": lambda: _redis(request.getfixturevalue("key_prefix")),
        "redis-cluster": lambda: _redis(
            request.getfixturevalue("cluster_key_prefix"),
            request.getfixturevalue("redis_cluster_url"),
        ),
    }
    made = builders[request.param]()
    yield made
    made.store.close()


def finish(
    store: TrajectoryStore,
    tid: str,
    *,
    at: float,
    state: LifecycleState = S.COMPLETED,
    tenant: str = "acme",
    owes: bool = False,
    rows: int = 3,
) -> TrajectoryRecord:
    """Create ``tid`` and end it in ``state`` with ``rows`` chain rows, the last written at
    ``at``; returns the stored record."""
    store.create(make_record(tid, tenant))
    ended = next_version(store.load(tenant, tid), state)
    if owes:
        ended = with_open_call(ended, OpStatus.UNKNOWN)
    chain = [row_for(ended, i).model_copy(update={"at": at - rows + 1 + i}) for i in range(rows)]
    ended = ended.model_copy(update={"chain_length": rows})
    store.compare_and_set(ended, 1, chain)
    return store.load(tenant, tid)


# --- retire ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.COMPLETED, S.FAILED, S.CANCELED])
def test_retire_deletes_record_chain_commits_and_index(
    backend: Backend, state: LifecycleState
) -> None:
    store = backend.store
    rec = finish(store, "t1", at=1.0, state=state)
    finish(store, "t2", at=1.0, state=state)
    assert backend.leftovers("acme", "t1"), "the test sees what is stored"
    assert store.retire("acme", "t1", rec.record_version) is Retirement.RETIRED
    assert backend.leftovers("acme", "t1") == []
    with pytest.raises(SnapshotNotFound):
        store.load("acme", "t1")
    assert store.read("acme", "t1") == [] and store.last_row("acme", "t1") is None
    assert store.committed("acme", "t1", rec.record_version) is None
    assert store.list("acme") == ["t2"] and store.list("acme", state) == ["t2"]
    assert store.count("acme", state) == 1 and store.page("acme", state, "", 10) == ["t2"]
    assert len(store.read("acme", "t2")) == 3, "the other trajectory is untouched"
    assert store.retire("acme", "t1", rec.record_version) is Retirement.GONE


def test_retire_keeps_a_live_run_and_one_that_still_owes(backend: Backend) -> None:
    store = backend.store
    store.create(make_record("live"))
    owing = finish(store, "owing", at=1.0, state=S.CANCELED, owes=True)
    assert store.owing("acme") == ["owing"]
    assert store.retire("acme", "live", 1) is Retirement.KEPT
    assert store.retire("acme", "owing", owing.record_version) is Retirement.KEPT
    assert store.load("acme", "live").state is S.READY
    assert store.load("acme", "owing") == owing and store.owing("acme") == ["owing"]
    assert len(store.read("acme", "owing")) == 3
    assert store.retire("acme", "nobody", 1) is Retirement.GONE
    assert store.retire("globex", "live", 1) is Retirement.GONE, "tenants stay apart"


def test_a_commit_before_the_retire_wins_and_one_after_it_loses(backend: Backend) -> None:
    store = backend.store
    seen = finish(store, "t1", at=1.0)
    later = next_version(seen)
    store.compare_and_set(later, seen.record_version)
    assert store.retire("acme", "t1", seen.record_version) is Retirement.CHANGED
    assert store.load("acme", "t1") == later
    assert store.retire("acme", "t1", later.record_version) is Retirement.RETIRED
    with pytest.raises(SnapshotNotFound):
        store.compare_and_set(next_version(later), later.record_version)
    assert backend.leftovers("acme", "t1") == [], "a losing commit writes nothing"


def test_a_commit_racing_retires_is_never_lost(backend: Backend) -> None:
    """One thread commits a finished trajectory over and over while another retires it at the
    version it last read: whatever a commit reported written is there, or was retired after."""
    store = backend.store
    finish(store, "t1", at=1.0)
    committed: list[int] = []
    retired: list[int] = []
    stop = threading.Event()

    def commit() -> None:
        while not stop.is_set():
            try:
                current = store.load("acme", "t1")
                committed.append(
                    store.compare_and_set(next_version(current), current.record_version)
                )
            except (ConcurrentModification, SnapshotNotFound):
                if retired:
                    return

    def retire() -> None:
        for _ in range(2000):
            try:
                version = store.load("acme", "t1").record_version
            except SnapshotNotFound:
                break
            if store.retire("acme", "t1", version) is Retirement.RETIRED:
                retired.append(version)
                break
        stop.set()

    threads = [threading.Thread(target=commit), threading.Thread(target=retire)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    if retired:
        assert max(committed, default=0) <= retired[0], "a commit won after its retire"
        assert backend.leftovers("acme", "t1") == []
    else:  # the committer won every round: the last commit is what is stored
        assert store.load("acme", "t1").record_version == max(committed)


# --- the sweep ------------------------------------------------------------------------------


def _sweep(store: TrajectoryStore, tenants: tuple[str, ...], **kw: float) -> RetentionSweep:
    keep = {"acme": KEEP_S, "globex": 90 * DAY_S}
    return RetentionSweep(store, tenants, keep_s=keep.__getitem__, clock=lambda: NOW, **kw)


def test_the_sweep_retires_what_expired_and_keeps_the_rest(backend: Backend) -> None:
    store = backend.store
    old = NOW - KEEP_S - 1.0
    expired = {
        "done": finish(store, "done", at=old),
        "failed": finish(store, "failed", at=old, state=S.FAILED),
        "canceled": finish(store, "canceled", at=old, state=S.CANCELED, rows=0),
    }
    fresh = finish(store, "fresh", at=NOW - KEEP_S + 60.0)
    owing = finish(store, "owing", at=old, state=S.CANCELED, owes=True)
    store.create(make_record("live"))  # submitted at 0: long ago, but live
    longer = finish(store, "done", at=old, tenant="globex")  # globex keeps 90 days
    retired = _sweep(store, ("acme", "globex"), every_s=0).sweep()
    assert sorted(retired) == sorted(("acme", tid) for tid in expired)
    for tid in expired:
        assert backend.leftovers("acme", tid) == [], tid
        assert store.read("acme", tid) == []
    assert store.load("acme", "fresh") == fresh and store.load("acme", "owing") == owing
    assert store.load("acme", "live").state is S.READY
    assert store.load("globex", "done") == longer
    assert store.list("acme") == ["fresh", "live", "owing"] and store.owing("acme") == ["owing"]


def test_the_sweep_reads_a_bounded_page_per_pass_and_misses_nothing(backend: Backend) -> None:
    store = backend.store
    old = NOW - KEEP_S - 1.0
    for i in range(10):
        finish(store, f"t{i:02d}", at=old if i % 3 else NOW)  # t00, t03, t06, t09 stay
    sweep = _sweep(store, ("acme",), every_s=0, budget=4)
    passes = []
    while sweep.laps == 0:
        passes.append(len(sweep.sweep()))
        assert len(passes) < 10, "the walk never ends"
    assert max(passes) <= 4 and sum(passes) == 6
    assert store.list("acme") == ["t00", "t03", "t06", "t09"]


def test_the_sweep_runs_once_every_every_s() -> None:
    store = InProcessStore()
    finish(store, "t1", at=0.0)
    now = [NOW]
    sweep = RetentionSweep(store, ("acme",), lambda t: KEEP_S, lambda: now[0], every_s=10.0)
    finish(store, "t2", at=0.0)
    assert len(sweep.sweep()) == 2
    finish(store, "t3", at=0.0)
    now[0] += 9.0
    assert sweep.sweep() == [] and store.list("acme") == ["t3"]
    now[0] += 1.0
    assert sweep.sweep() == [("acme", "t3")]
