"""Smoke test of ``reins bench fleet --quick``: real processes, every figure there and sane.

Timings are never asserted: only that each figure is a positive number, every trajectory
ended ``done``, and the processes it started are gone and their keys cleaned.
"""

from __future__ import annotations

import math

import pytest
import redis

from ops import bench as benchmarks

pytestmark = [pytest.mark.redis, pytest.mark.slow]
FIGURES = (
    "steps_per_s",
    "celery_noop_per_s",
    "cpu_ratio",
    "cpu_cost_ratio",
    "latency_efficiency",
    "p99_admission_to_start_ms",
    "worker_cpu_ms_per_step",
    "router_cpu_ms_per_step",
)


def test_quick_run_reports_every_figure(redis_client: redis.Redis) -> None:
    result = benchmarks.load("fleet")(quick=True)
    assert result["peer"] == benchmarks.peer("fleet")
    for name in FIGURES:
        value = result[name]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (name, value)
    assert result["unfinished"] == 0 and result["workers"] == 2 and result["routers"] == 2
    assert result["latency_concurrent_trajectories"] == 200
    assert 0 <= result["follow_on_share"] <= 1 and 0 <= result["follow_on_share_latency"] <= 1
    # Configured as deployed (the document, no tenants file), the workers admit follow-on
    # turns: uncontended fast runs take most of their turns that way.
    assert result["configured_by"].startswith("fleet document")
    assert result["follow_on_share"] > 0, "follow-on turns by the fleet's document"
    assert not list(redis_client.scan_iter(match="reins-bench-*", count=1000)), "keys cleaned"
