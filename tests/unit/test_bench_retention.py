"""Smoke test of ``reins bench retention``: every figure is there, every trajectory measured is
retired and nothing of it is left (timings never asserted)."""

from __future__ import annotations

import pytest

from ops import bench as benchmarks
from tests.conftest import REDIS_URL


@pytest.mark.redis
def test_quick_run_measures_and_retires_every_trajectory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.delenv("REINS_TEST_REDIS_URL", raising=False)  # not a reins setting
    result = benchmarks.load("retention")(quick=True)
    assert result["peer"] == benchmarks.peer("retention")
    assert result["trajectories"] == result["retired"] == 20
    assert result["left_after_retire"] == 0
    assert result["chain_rows_per_trajectory"] == 22, "ten turns: model and tool rows, a stop"
    parts = result["snap_bytes"] + result["chain_bytes"] + result["index_bytes"]
    assert abs(result["bytes_per_finished"] - parts) <= 2
    assert result["snap_bytes"] > result["record_json_bytes"], "the hash holds the JSON"
    assert result["peer_plain_bytes"] > result["record_json_bytes"]
