"""Smoke test of ``reins bench store``: every figure is there, the peer names the commit's own
path, and the server's counters are kept only from windows the bench had to itself (timings
never asserted)."""

from __future__ import annotations

import pytest

from ops import bench as benchmarks
from ops.bench.commandstats import ServerTime, Tally
from tests.conftest import REDIS_URL


@pytest.mark.redis
def test_quick_run_reports_every_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.delenv("REINS_TEST_REDIS_URL", raising=False)  # not a reins setting
    result = benchmarks.load("store")(quick=True)
    assert result["topology"] == "single"
    assert result["peer"] == benchmarks.peer("store")
    assert "direct_command" in result["peer"]["path"], "the SET takes the commit's path"
    for n in (1, 16):
        for kind in ("cas", "cas_row", "raw_set", "pool_set"):
            assert result[f"c{n}_{kind}_per_s"] > 0, kind
        assert result[f"c{n}_ratio"] > 0
        windows_left_out = result[f"c{n}_redis_windows_left_out"]
        assert 0 <= windows_left_out <= 3 * result["rounds"]  # three counted phases a round
        for kind in ("set", "cas", "cas_row"):
            us = result[f"c{n}_redis_us_per_{kind}"]
            assert us is None or us > 0, (kind, us)  # None: another client ran in every window


def test_a_window_with_another_clients_calls_is_left_out_and_counted() -> None:
    spent = ServerTime()
    spent.add(Tally(10, 100), Tally(15, 160), own_calls=5)  # the phase's five calls alone
    spent.add(Tally(15, 160), Tally(22, 400), own_calls=5)  # two more: someone else's
    assert (spent.windows, spent.left_out) == (2, 1)
    assert spent.us_per_call() == 12.0, "only the clean window's 60 us over 5 calls"


def test_no_clean_window_gives_no_figure() -> None:
    spent = ServerTime()
    spent.add(Tally(10, 100), Tally(0, 0), own_calls=5)  # the counters were reset meanwhile
    assert spent.us_per_call() is None and spent.left_out == 1
