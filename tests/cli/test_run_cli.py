"""`reins run` and `reins demo` as a user calls them."""

from __future__ import annotations

import json
import subprocess
import sys

GOAL = "refund the damaged item on order ord_1001"


def reins(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from ops.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_run_json_ends_done_with_one_refund_and_one_email() -> None:
    p = reins("run", "examples.support_store:agent", "--goal", GOAL, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["stop_reason"] == "done" and out["state"] == "COMPLETED"
    assert out["effects"] == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
    for key in ("steps", "tool_calls", "tokens", "cost_usd", "active_s", "closing_message"):
        assert key in out


def test_run_with_step_budget_says_what_was_done() -> None:
    p = reins(
        "run", "examples.support_store:agent", "--goal", GOAL, "--budget", "max_steps=3", "--json"
    )
    out = json.loads(p.stdout)
    assert out["stop_reason"] == "max_steps"
    assert out["effects"] == [["refund", "ord_1001", 3000]]
    assert "refund was issued" in out["closing_message"]
    assert "email was not sent" in out["closing_message"]


def test_unknown_agent_is_refused_by_name() -> None:
    p = reins("run", "examples.support_store:nobody", "--goal", GOAL)
    assert p.returncode == 2
    assert "nobody" in p.stderr
    assert p.stdout == ""


def test_unknown_budget_key_is_refused_by_name() -> None:
    p = reins("run", "examples.support_store:agent", "--goal", GOAL, "--budget", "max_stepz=3")
    assert p.returncode == 2
    assert "max_stepz" in p.stderr


def test_demo_shows_two_tenants_and_their_stops() -> None:
    p = reins("demo")
    assert p.returncode == 0, p.stderr
    for word in (
        "acme/refund",
        "globex/slow-refund",
        "unknown_outcome",
        "no_progress",
        "max_steps",
    ):
        assert word in p.stdout
