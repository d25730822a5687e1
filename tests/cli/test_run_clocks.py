"""The issue's reproductions through `reins run`: no call starts once a clock ran out, and none
runs past the end (seed 000: "the remaining time becomes the timeout"; seed 004 10.9.1).

Each run is traced back by its id (`reins trace ID --json`): a model or tool span starts before
the first limit and ends by it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cli.test_run_cli import GOAL, reins

CALLS = ("model", "tool")


def run(agent: str, budget: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`reins run` of ``agent`` under ``budget``: its JSON summary and its call spans."""
    p = reins(
        "run", f"examples.support_store:{agent}", "--goal", GOAL, "--budget", budget, "--json"
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    traced = reins("trace", out["trajectory_id"], "--json")
    assert traced.returncode == 0, traced.stderr
    spans = json.loads(traced.stdout)["spans"]
    # A reservation written off at the stop is a zero-length span of its call: no dispatch.
    return out, [s for s in spans if s["kind"] in CALLS and s["status"] != "written_off"]


def test_with_wall_clock_2_no_tool_call_starts_after_2_seconds() -> None:
    out, spans = run("agent", "wall_clock_s=2")
    assert out["stop_reason"] == "wall_clock", out
    assert all(s["start"] < 2.0 and s["end"] <= 2.0 for s in spans), spans
    assert out["effects"] == []


def test_rewoo_with_deadline_1_9_sends_no_refund_after_the_deadline() -> None:
    out, spans = run("agent_rewoo", "deadline_s=1.9")
    assert out["stop_reason"] == "deadline", out
    assert not [s for s in spans if "issue_refund" in s["name"]], spans
    assert out["effects"] == [], "nothing took effect after the deadline"


@pytest.mark.parametrize(
    ("agent", "budget", "limit"),
    [
        ("agent_rewoo", "wall_clock_s=1.6", 1.6),
        ("agent_rewoo", "wall_clock_s=3.3", 3.3),
        ("agent_plan", "deadline_s=2.7", 2.7),
        ("agent", "wall_clock_s=1.24", 1.24),
        ("agent", "wall_clock_s=8.12", 8.12),
        ("agent_plan", "wall_clock_s=5.5", 5.5),
    ],
)
def test_every_call_starts_before_the_first_limit_and_ends_by_it(
    agent: str, budget: str, limit: float
) -> None:
    out, spans = run(agent, budget)
    assert spans, "the run made calls"
    late = [(s["name"], s["start"], s["end"]) for s in spans if s["end"] > limit + 1e-6]
    assert not late, f"{agent} under {budget} ran past {limit}s: {late}"
    assert all(s["start"] < limit for s in spans)
    assert out["stop_reason"] in ("wall_clock", "deadline", "unknown_outcome", "done"), out
