"""Smoke test of `reins bench kernel`: the fields exist and both sides did the work.

Timing is never asserted; the figures belong in the closing note, not in a test.
"""

import pytest

from ops import bench as benchmarks
from ops.bench import kernel_instructions
from ops.bench.kernel import run


def test_bench_kernel_fields() -> None:
    out = run(quick=True)
    assert out["peer"] == benchmarks.peer("kernel")
    for key in (
        "reins_traj_per_s",
        "langgraph_traj_per_s",
        "ratio",
        "reins_version",
        "langgraph_version",
        "trajectories",
    ):
        assert key in out
    assert out["reins_traj_per_s"] > 0 and out["langgraph_traj_per_s"] > 0
    assert out["trajectories"] >= 40


def test_the_instruction_count_names_a_side_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="side must be one of"):
        kernel_instructions.per_trajectory("temporal", 1)
