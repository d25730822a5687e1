"""The fleet-health metrics alone: closed label sets, a worker label that outlives a rollout.

Fed through the observer reports the loops make; the fleet run (tests/ops/
test_dashboard_fleet.py) checks them against what a real fleet did.
"""

from __future__ import annotations

import pytest
import redis

from kernel.chain import ChainRow, RowKind
from kernel.errors import StoreUnavailable
from ops.observability.metrics import Metrics
from router.wire.streams import GroupLag
from router.wire.turns import HandBackWhy
from store.redis_client import REDIS_ERRORS, retry_transient


def value(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def recovery(state: str) -> ChainRow:
    return ChainRow(
        trajectory_id="t",
        tenant="acme",
        user="u",
        index=3,
        step=1,
        kind=RowKind.CONTROL,
        record_version=5,
        at=1.0,
        outcome="recovered",
        detail={"state": state},
    )


def test_the_worker_label_outlives_the_pod_and_the_pod_is_an_info_series() -> None:
    old, new = Metrics(worker_label="workers"), Metrics(worker_label="workers")
    old.on_worker("workers-7d9f-abcde")
    new.on_worker("workers-7d9f-fghij")  # the rollout's replacement pod
    assert value(old, "reins_turn_duration_seconds_count", worker="workers") == 0, "from 0"
    old.on_turn("workers-7d9f-abcde", 0.2)
    new.on_turn("workers-7d9f-fghij", 0.2)
    for m, pod in ((old, "workers-7d9f-abcde"), (new, "workers-7d9f-fghij")):
        assert value(m, "reins_worker_info", worker="workers", member=pod) == 1
        assert value(m, "reins_turn_duration_seconds_count", worker="workers") == 1
        # every per-worker series exists from 0, under the stable label only
        assert value(m, "reins_handbacks_total", worker="workers", why="schema") == 0
        assert value(m, "reins_turn_affinity_total", worker="workers", placement="hit") == 0
    plain = Metrics()
    plain.on_worker("w1")
    plain.on_turn("w1", 0.1)
    assert value(plain, "reins_turn_duration_seconds_count", worker="w1") == 1


def test_reports_land_in_their_closed_series() -> None:
    m = Metrics(process_metrics=False)
    m.on_worker("w1")
    m.on_affinity("w1", True)
    m.on_affinity("w1", True)
    m.on_affinity("w1", False)
    m.on_follow_on("w1")
    m.on_hand_back("w1", HandBackWhy.DRAINING)
    m.on_queue("w1", 4, 2.5)
    m.on_feed_lag({"notices": GroupLag(lag=3, pending=2), "handbacks": GroupLag(-1, 0)})
    m.count_recoveries([recovery("CALLING_MODEL"), recovery("WAITING_TOOL"), recovery("BOGUS")])
    assert value(m, "reins_turn_affinity_total", worker="w1", placement="hit") == 2
    assert value(m, "reins_turn_affinity_total", worker="w1", placement="miss") == 1
    assert value(m, "reins_follow_on_turns_total", worker="w1") == 1
    assert value(m, "reins_handbacks_total", worker="w1", why="draining") == 1
    assert value(m, "reins_worker_queue_depth", worker="w1") == 4
    assert value(m, "reins_worker_queue_oldest_age_seconds", worker="w1") == 2.5
    assert value(m, "reins_feed_lag_entries", source="notices") == 3
    assert value(m, "reins_feed_pending_entries", source="notices") == 2
    assert value(m, "reins_feed_lag_entries", source="handbacks") == 0  # unknown: not negative
    assert value(m, "reins_recoveries_total", state="CALLING_MODEL") == 1
    assert value(m, "reins_recoveries_total", state="WAITING_TOOL") == 1
    assert value(m, "reins_recoveries_total", state="other") == 1


def test_each_failed_redis_attempt_is_counted_once() -> None:
    m = Metrics(process_metrics=False)
    before = value(m, "reins_redis_errors_total") or 0
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise redis.ConnectionError("refused")
        return "ok"

    assert retry_transient(flaky, what="a read", attempts=5, counted=5) == "ok"
    assert (value(m, "reins_redis_errors_total") or 0) - before == 2

    def down() -> str:
        raise redis.TimeoutError("no reply")

    with pytest.raises(StoreUnavailable, match="unreachable"):
        retry_transient(down, what="a read", attempts=2, counted=2)
    assert (value(m, "reins_redis_errors_total") or 0) - before == 4
    assert REDIS_ERRORS.value >= 4
