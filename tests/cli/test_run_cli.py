"""`reins run` and `reins demo` as a user calls them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

GOAL = "refund the damaged item on order ord_1001"


STORE_DIR = tempfile.mkdtemp(prefix="reins-cli-")  # the embedded store, outside the repo


def reins(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REINS_SQLITE_PATH": os.path.join(STORE_DIR, "reins.db")}
    return subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
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


def test_run_is_kept_in_the_embedded_store_and_traced_by_id() -> None:
    out = json.loads(reins("run", "examples.support_store:agent", "--goal", GOAL, "--json").stdout)
    p = reins("trace", out["trajectory_id"], "--json")
    assert p.returncode == 0, p.stderr
    trace = json.loads(p.stdout)
    assert trace["postmortem"]["stop"] == "done" and trace["postmortem"]["steps"] == 5
    assert sum(1 for s in trace["spans"] if s["kind"] == "tool") == 3
