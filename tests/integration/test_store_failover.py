"""What the store says when Redis lost acknowledged commits (a failover to a replica that was
behind, a restart without the AOF): the next writer loses, and learns why."""

from __future__ import annotations

import pytest
import redis

from kernel.errors import ConcurrentModification
from store.redis_store import RedisStore
from tests.contract.advance_worker import make_record, next_version

pytestmark = pytest.mark.redis


def test_a_commit_lost_by_a_failover_is_named_by_the_next_writer(
    redis_store: RedisStore, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica promoted before it had the primary's last commit: the snapshot goes back a
    version. The writer that committed it loses its next compare-and-set, and the store says
    why in an error, naming both versions."""
    redis_store.create(make_record("t1"))
    snap_key = redis_store.trajectory_keys("acme", "t1")[0]
    replica_had = redis_client.dump(snap_key)
    v2 = next_version(redis_store.load("acme", "t1"))
    redis_store.compare_and_set(v2, 1)
    redis_client.restore(snap_key, 0, replica_had, replace=True)  # the failover
    with pytest.raises(ConcurrentModification) as lost:
        redis_store.compare_and_set(next_version(v2), 2)
    assert (lost.value.expected_version, lost.value.current_version) == (2, 1)
    (error,) = [r for r in caplog.records if r.name == "reins.store"]
    assert "stored at version 1, below the version 2" in error.getMessage()
    assert "lost acknowledged writes" in error.getMessage()
