"""A smoke run of ``reins bench scale`` on a small fleet: every figure is there and consistent
(the simulation is seeded; timings are never asserted)."""

from __future__ import annotations

import pytest

from ops import bench as benchmarks
from ops.bench import scale
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def test_a_small_simulated_fleet_reports_every_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scale, "WORKERS", 40)
    monkeypatch.setattr(scale, "TENANTS", 300)
    monkeypatch.setattr(scale, "REDIS_TENANTS_QUEUED", 100)
    monkeypatch.setattr(scale, "REDIS_ADMISSIONS", 64)
    monkeypatch.setattr(scale, "CHURN_EVERY_S", 5.0)
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    result = benchmarks.load("scale")(trajectories=600)
    assert result["peer"] == benchmarks.peer("scale")
    assert result["trajectories"] == 600 and result["workers"] == 40
    # Every trajectory ran all its turns (or was refused at the door): one admission a turn.
    assert result["admissions"] >= 600 - result["trajectories_refused"]  # type: ignore[operator]
    assert result["ring_changes"] >= 1  # the fleet changed under the run
    for field in (
        "router_admissions_per_cpu_s",
        "placements_per_cpu_s",
        "redis_us_per_admission",
        "replicas_per_redis_slot_at_cpu_rate",
        "replicas_per_redis_slot_at_redis_rate",
    ):
        assert isinstance(result[field], int | float) and result[field] > 0, (field, result)


def test_a_trajectory_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="trajectories"):
        scale.run(trajectories=0)
