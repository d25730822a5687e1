"""A smoke run of ``reins bench admitter``: every field is there; timings are never asserted."""

from __future__ import annotations

from ops import bench as benchmarks
from ops.bench.admitter import run


def test_bench_admitter_quick_run_reports_every_field() -> None:
    result = run(quick=True)
    assert result["peer"] == benchmarks.peer("admitter")
    for field in (
        "admissions_per_s",
        "max_share_error_pct_pt",
        "jain_index",
        "noisy_neighbor_p99_ratio",
        "fifo_noisy_neighbor_p99_ratio",
        "noisy_neighbor_baseline_p99_s",
        "admissions_per_s_at_10k_tenants",
        "ratio_10k_to_3_tenants",
        "bytes_per_tenant",
    ):
        assert isinstance(result[field], int | float), field
    assert isinstance(result["admissions"], int) and result["admissions"] >= 10_000
    # simulated time and seeded arrivals: these are deterministic, not timings
    assert result["max_share_error_pct_pt"] <= 1.0  # type: ignore[operator]
    assert result["jain_index"] >= 0.99  # type: ignore[operator]
    assert result["noisy_neighbor_baseline_p99_s"] > 0  # type: ignore[operator]
    assert result["fifo_noisy_neighbor_p99_ratio"] > result["noisy_neighbor_p99_ratio"]  # type: ignore[operator]
