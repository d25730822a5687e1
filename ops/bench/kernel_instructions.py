"""Instructions per trajectory, reins and LangGraph, counted by callgrind.

Wall time on a shared machine of two cores moves by a factor of two between runs; an
instruction count does not (callgrind counts the same total for the same binary, inputs and
environment, whatever else the machine is doing). Each side runs in a process of its own under
``valgrind --tool=callgrind``, twice: with ``n`` trajectories after its warm-up and with none,
so the difference divided by ``n`` is what one trajectory costs, imports and warm-up excluded.
The hash seed is fixed so the two runs of a side take the same paths through dicts and sets.

What an instruction count does not see: time spent waiting (a thread hand-off, a lock, the
GIL) and cache misses. ``reins bench kernel`` reports it beside the wall-clock ratio, not in
its place.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SIDES = ("reins", "langgraph")
WARM = 2  # trajectories each side runs before the counted ones (caches, lazy imports)


def available() -> bool:
    """True when valgrind is installed (it is on every machine of this kind)."""
    return shutil.which("valgrind") is not None


def per_trajectory(side: str, n: int) -> float:
    """Instructions one trajectory of ``side`` costs, from runs of ``n`` and of no trajectory."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    return (_count(side, n) - _count(side, 0)) / n


def _count(side: str, n: int) -> int:
    """Total instructions of one process running ``n`` trajectories of ``side``."""
    with tempfile.TemporaryDirectory(prefix="reins-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            __name__,
            side,
            str(n),
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=900)
        found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
        if found is None:
            raise RuntimeError(f"callgrind wrote no total to {out}")
        return int(found.group(1))


def _run(side: str, n: int) -> None:
    """The counted process: warm up, then ``n`` trajectories of ``side``."""
    from examples.support_store import make_agent
    from kernel.context import KernelContext
    from ops.bench.kernel import build_graph, langgraph_once, reins_once
    from store.in_process import InProcessStore

    if side == "reins":
        ctx, store = KernelContext(make_agent().profile), InProcessStore()
        for i in range(-WARM, n):
            reins_once(ctx, store, i)
    else:
        graph = build_graph()
        for i in range(-WARM, n):
            langgraph_once(graph, i)


if __name__ == "__main__":
    _run(sys.argv[1], int(sys.argv[2]))
