"""``reins bench api --quick`` runs and reports its figures (never judged on timing here)."""

from __future__ import annotations

import pytest

from ops import bench

pytestmark = pytest.mark.redis


def test_the_api_bench_reports_rates_a_ratio_and_event_latencies() -> None:
    result = bench.load("api")(quick=True)
    assert result["peer"] == bench.peer("api")
    assert set(result) >= {
        "api_submits_per_s",
        "direct_submits_per_s",
        "ratio",
        "event_p50_ms",
        "event_p99_ms",
    }
    assert result["events"] == 60, "an event of the followed trajectory never arrived"
    assert result["api_submits_per_s"] > 0 and result["direct_submits_per_s"] > 0
    assert result["ratio"] > 0  # the median of the rounds' quotients
    assert result["event_p50_ms"] <= result["event_p99_ms"]
