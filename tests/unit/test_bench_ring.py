"""Smoke test of ``reins bench ring``: every figure is there and sane (timings never asserted)."""

from __future__ import annotations

import pytest

from ops import bench as benchmarks

FIELDS = {
    "lookups_per_s",
    "uhashring_lookups_per_s",
    "ratio",
    "max_over_mean_load",
    "uhashring_max_over_mean_load",
    "moved_fraction_on_add",
    "ideal_moved_fraction",
    "moved_to_new_member",
    "modulo_moved_fraction",
    "uhashring_version",
    "xxhash_version",
    "rebuild_ms_at_200",
    "rss_mb_at_200",
}


def test_quick_run_reports_every_figure() -> None:
    pytest.importorskip("uhashring")
    result = benchmarks.load("ring")(quick=True)
    assert result["peer"] == benchmarks.peer("ring")
    missing = FIELDS - set(result)
    assert not missing, missing
    assert result["members"] == 20 and result["uhashring_points_per_member"] == 160
    for name in ("lookups_per_s", "uhashring_lookups_per_s", "ratio", "bisect_lookups_per_s"):
        assert isinstance(result[name], int | float) and result[name] > 0, name
    # Load is max over mean: at least 1, and far from "everything on one member" (20).
    for name in ("max_over_mean_load", "uhashring_max_over_mean_load"):
        assert 1.0 <= result[name] < 2.0, name
    assert result["ideal_moved_fraction"] == pytest.approx(1 / 21, abs=1e-5)
    # Consistent hashing: every moved key goes to the newcomer, about 1/n of them move.
    assert result["moved_to_new_member"] == 1.0
    assert 0.0 < result["moved_fraction_on_add"] < 0.2
    assert result["modulo_moved_fraction"] > 0.8  # modulo moves almost everything
    assert result["uhashring_version"] != "unknown"
    # The ring at 200 members, built in a fresh process (quick runs skip 1,000).
    assert result["points_at_200"] == 200 * result["points_per_member"]
    assert 1.0 <= result["max_over_mean_share_at_200"] < 1.2
