"""Through `reins run` and `reins approve` alone: a plan's refund held for a reviewer inside a
ReWOO plan, and a run whose agent writes a closing report in FINALIZING."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel.chain import ChainRow, RowKind
from store.sqlite import SqliteStore
from tests.cli.test_control_cli import Cli

BIG = "refund the damaged item on order ord_1004"  # 15,000 cents: over the automatic limit
GOAL = "refund the damaged item on order ord_1001"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "reins.db")


def chain(cli: Cli, tid: str) -> list[ChainRow]:
    store = SqliteStore(cli.path)
    try:
        return list(store.read("default", tid))
    finally:
        store.close()


def test_a_rewoo_plan_holds_its_refund_and_reins_approve_completes_it_once(cli: Cli) -> None:
    held = cli.json("run", "examples.support_store:agent_rewoo", "--goal", BIG)
    assert held["state"] == "AWAITING_APPROVAL" and held["effects"] == []
    tid = held["trajectory_id"]
    assert held["held_approval"] == f"{tid}/ap1"
    done = cli.json("approve", tid)
    assert done["state"] == "COMPLETED" and done["stop_reason"] == "done"
    assert done["effects"] == [["refund", "ord_1004", 15000], ["email", "ord_1004"]]
    refunds = [r for r in chain(cli, tid) if r.kind is RowKind.TOOL and r.tool == "issue_refund"]
    assert [r.outcome for r in refunds] == ["ok"], "one refund, sent once"


def test_a_closing_report_is_written_in_finalizing_from_the_reserve(cli: Cli) -> None:
    out = cli.json(
        "run", "examples.support_store:agent_reporting", "--goal", GOAL, "--budget", "max_steps=4"
    )
    assert out["state"] == "FAILED" and out["stop_reason"] == "max_steps"
    assert out["closing_report"] and "max_steps" in out["closing_report"]
    assert out["steps"] == 4, "three ordinary steps and the reserve's closing call"
    rows = chain(cli, out["trajectory_id"])
    outcomes = [(r.kind, r.outcome) for r in rows]
    at = outcomes.index((RowKind.CONTROL, "finalizing"))
    assert rows[at].detail["closing"] == "admitted"
    assert rows[at + 1].kind is RowKind.MODEL and rows[at + 1].detail["purpose"] == "closing"
    assert outcomes[-1] == (RowKind.STOP, "max_steps")
    assert out["tokens"] <= 6000, "within budget plus reserve"
