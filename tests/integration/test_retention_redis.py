"""Retention on the running Redis, where a retire is two calls on two hash tags: what a retire
cut off between them leaves, and a commit that lands inside a retire's window."""

from __future__ import annotations

import pytest
import redis

from kernel.record import TrajectoryRecord
from router.process.retention import RetentionSweep
from store.base import Retirement
from store.redis_store import STATE_CODES, RedisStore
from tests.contract.advance_worker import make_record, next_version
from tests.contract.test_retention_contract import KEEP_S, NOW, finish

pytestmark = pytest.mark.redis


def _indexed(client: redis.Redis, redis_store: RedisStore, tid: str) -> list[float]:
    scores = [client.zscore(key, tid) for key in redis_store.index_keys("acme")]
    return [s for s in scores if s is not None]


def test_a_retire_cut_off_after_its_first_call_is_finished_by_the_next_sweep(
    redis_store: RedisStore, redis_client: redis.Redis
) -> None:
    rec = finish(redis_store, "t1", at=0.0)
    snap_key, chain_key = redis_store.trajectory_keys("acme", "t1")
    # the first call alone, as a router that died before the second would leave it
    assert (
        redis_store._retire.run(redis_client, [snap_key, chain_key], [rec.record_version])[0] == 1
    )
    assert redis_client.exists(snap_key, chain_key) == 0
    assert _indexed(redis_client, redis_store, "t1") == [STATE_CODES[rec.state]]
    assert redis_store.list("acme") == ["t1"], "listed, though there is nothing to load"
    sweep = RetentionSweep(redis_store, ("acme",), lambda t: KEEP_S, lambda: NOW, every_s=0)
    assert sweep.sweep() == [], "nothing was retired by this pass"
    assert _indexed(redis_client, redis_store, "t1") == [] and redis_store.list("acme") == []


def test_an_id_created_again_keeps_its_entry_when_an_old_retire_finishes(
    redis_store: RedisStore, redis_client: redis.Redis
) -> None:
    rec = finish(redis_store, "t1", at=0.0)
    snap_key, chain_key = redis_store.trajectory_keys("acme", "t1")
    redis_store._retire.run(redis_client, [snap_key, chain_key], [rec.record_version])
    redis_store.create(make_record("t1"))  # a job that names its id submits it again
    redis_store._drop_entry("acme", "t1")  # the cut-off retire's second call, late
    assert _indexed(redis_client, redis_store, "t1") == [STATE_CODES[make_record().state]]
    assert redis_store.list("acme") == ["t1"]


def test_a_commit_inside_the_retire_window_wins(
    redis_store: RedisStore, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit lands after retire read the record and before its script runs: the script
    compares the version and deletes nothing."""
    seen = finish(redis_store, "t1", at=0.0)
    load = redis_store.load
    won: list[TrajectoryRecord] = []

    def load_then_commit(tenant: str, tid: str) -> TrajectoryRecord:
        found = load(tenant, tid)
        if not won:
            won.append(next_version(found))
            redis_store.compare_and_set(won[0], found.record_version)
        return found

    monkeypatch.setattr(redis_store, "load", load_then_commit)
    assert redis_store.retire("acme", "t1", seen.record_version) is Retirement.CHANGED
    monkeypatch.undo()
    assert redis_store.load("acme", "t1") == won[0]
    assert len(redis_store.read("acme", "t1")) == 3
    assert _indexed(redis_client, redis_store, "t1") == [STATE_CODES[seen.state]]


def test_a_stale_owing_entry_goes_with_the_trajectory(
    redis_store: RedisStore, redis_client: redis.Redis
) -> None:
    """An owing entry for a run that owes nothing (its owing write cut off from its commit, as
    a store that writes it apart could leave) names a trajectory retire deletes: it goes too."""
    rec = finish(redis_store, "t1", at=0.0)
    redis_client.zadd(redis_store.owing_key_for("acme", "t1"), {"t1": 0})
    assert redis_store.retire("acme", "t1", rec.record_version) is Retirement.RETIRED
    assert redis_store.owing("acme") == []
