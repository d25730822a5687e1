"""Smoke test of ``reins bench memory``: every figure is there and both backends agree with
the brute-force scan (timings never asserted)."""

from __future__ import annotations

import pytest

from ops import bench as benchmarks
from tests.conftest import REDIS_URL


@pytest.mark.redis
def test_quick_run_reports_every_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.delenv("REINS_TEST_REDIS_URL", raising=False)  # not a reins setting
    result = benchmarks.load("memory")(quick=True)
    assert result["peer"] == benchmarks.peer("memory")
    for size in (1_000, 5_000):
        figures = result[f"facts_per_owner_{size}"]
        assert isinstance(figures, dict)
        for backend in ("sqlite", "redis"):
            assert figures[f"{backend}_agrees_with_scan"] is True
            for name in (backend, f"{backend}_scan"):
                assert figures[name]["p50_ms"] <= figures[name]["p99_ms"]
