"""Smoke test of ``reins bench provider``: every figure is there, the pooled phase reused its
connections while the other opened one per call, and every cancel was seen to close (timings
never asserted)."""

from __future__ import annotations

from ops import bench as benchmarks
from ops.bench import provider


def test_quick_run_reports_every_figure() -> None:
    result = benchmarks.load("provider")(quick=True)
    assert result["peer"] == benchmarks.peer("provider")
    calls = provider.THREADS * result["calls"] * provider.ROUNDS
    assert result["per_call_connections"] == calls  # one connection per call
    assert result["pooled_connections"] <= provider.THREADS * provider.ROUNDS  # reused
    for mode in ("pooled", "per_call"):
        assert result[f"{mode}_calls_per_s"] > 0
        assert 0 <= result[f"{mode}_overhead_p50_ms"] <= result[f"{mode}_overhead_p99_ms"]
    assert result["cancels"] == 10
    assert 0 <= result["cancel_to_closed_p50_ms"] <= result["cancel_to_closed_p99_ms"]
    if "tls_ratio" in result:  # openssl was there to make a certificate
        tls_calls = provider.THREADS * (result["calls"] // 2) * provider.ROUNDS
        assert result["tls_per_call_connections"] == tls_calls
        assert result["tls_pooled_connections"] <= provider.THREADS * provider.ROUNDS
