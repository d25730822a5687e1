"""``reins bench``'s options: ``--trajectories`` belongs to ``bench scale`` alone."""

from __future__ import annotations

import subprocess
import sys


def reins(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from ops.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


def test_trajectories_for_another_bench_is_refused_naming_it() -> None:
    result = reins("bench", "ring", "--trajectories", "5", "--json")
    assert result.returncode != 0
    assert "benchmark 'ring' has no --trajectories option" in result.stdout + result.stderr


def test_trajectories_below_one_is_refused() -> None:
    result = reins("bench", "scale", "--trajectories", "0")
    assert result.returncode != 0
    assert "--trajectories" in result.stdout + result.stderr
