"""`reins approve | deny | pause | resume | cancel ID` with no API: on the embedded store, where
`reins run` left the run. Seed 000 scenario G from the command line alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kernel.chain import RowKind
from store.sqlite import SqliteStore

AGENT = "examples.support_store:agent"
BIG_REFUND = "refund 6000 cents of the damaged item on order ord_1004"  # over AUTO_LIMIT
REFUND_AND_EMAIL = [["refund", "ord_1004", 6000], ["email", "ord_1004"]]


class Cli:
    """The CLI as a subprocess on its own embedded store, with no API configured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = {k: v for k, v in os.environ.items() if k not in _API}
        self.env["REINS_SQLITE_PATH"] = str(path)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", "from ops.cli.main import main; main()", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=self.env,
        )

    def json(self, *args: str) -> dict[str, Any]:
        p = self(*args, "--json")
        assert p.returncode == 0, p.stderr
        out: dict[str, Any] = json.loads(p.stdout)
        return out

    def held_run(self) -> dict[str, Any]:
        out = self.json("run", AGENT, "--goal", BIG_REFUND)
        assert out["state"] == "AWAITING_APPROVAL" and out["effects"] == [], "held before acting"
        return out

    def stored(self, tid: str) -> tuple[int, int, list[str]]:
        """The record's version, its chain's length, and the refund tool rows' outcomes."""
        store = SqliteStore(self.path)
        try:
            rec, rows = store.load("default", tid), store.read("default", tid)
        finally:
            store.close()
        refunds = [
            r.outcome or "" for r in rows if r.kind is RowKind.TOOL and r.tool == "issue_refund"
        ]
        return rec.record_version, len(rows), refunds


_API = ("REINS_API_URL", "REINS_API_KEY")


def said(p: subprocess.CompletedProcess[str]) -> str:
    """The error line as one line (the console wraps it at its width)."""
    return " ".join(p.stderr.split())


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path / "reins.db")


def test_a_held_run_is_approved_from_the_cli_and_completes_with_one_refund(cli: Cli) -> None:
    held = cli.held_run()
    tid = held["trajectory_id"]
    assert held["held_approval"] == f"{tid}/ap1"

    done = cli.json("approve", tid)
    assert done["state"] == "COMPLETED" and done["stop_reason"] == "done"
    assert done["effects"] == REFUND_AND_EMAIL, "the approved refund, sent once, then the e-mail"
    assert cli.stored(tid)[2] == ["ok"], "one refund dispatched in the whole chain"

    before = cli.stored(tid)
    again = cli("approve", tid)
    assert again.returncode == 2 and again.stdout == ""
    assert f"{tid}/ap1" in said(again) and "approved, not held" in said(again)
    assert cli.stored(tid) == before, "a refused approval writes nothing"


def test_a_request_id_that_is_not_the_held_one_is_refused_and_the_held_one_stays(
    cli: Cli,
) -> None:
    tid = cli.held_run()["trajectory_id"]
    before = cli.stored(tid)
    wrong = cli("approve", tid, "--approval", f"{tid}/ap9")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert f"{tid}/ap9" in said(wrong) and f"{tid}/ap1 (held)" in said(wrong)
    assert cli.stored(tid) == before, "nothing was decided"
    done = cli.json("approve", tid, "--approval", f"{tid}/ap1")
    assert done["effects"] == REFUND_AND_EMAIL


def test_deny_ends_the_held_request_and_the_run_as_the_kernel_says(cli: Cli) -> None:
    tid = cli.held_run()["trajectory_id"]
    out = cli.json("deny", tid)
    assert out["state"] == "FAILED" and out["effects"] == [], "no refund after a denial"
    assert "the refund was not issued" in out["closing_message"]
    assert cli.stored(tid)[2] == [], "the denied refund was never dispatched"
    late = cli("approve", tid)
    assert late.returncode == 2 and "is denied, not held" in said(late)


def test_pause_withdraws_the_held_request_and_resume_asks_for_a_fresh_approval(
    cli: Cli,
) -> None:
    tid = cli.held_run()["trajectory_id"]
    assert cli.json("pause", tid)["state"] == "PAUSED"
    withdrawn = cli("approve", tid)
    assert withdrawn.returncode == 2 and "withdrawn" in said(withdrawn)

    resumed = cli.json("resume", tid)
    assert resumed["state"] == "AWAITING_APPROVAL", "the model proposed the refund again"
    assert resumed["held_approval"] == f"{tid}/ap2", "a new request, not the withdrawn one"
    stale = cli("approve", tid, "--approval", f"{tid}/ap1")
    assert stale.returncode == 2 and f"{tid}/ap2" in said(stale)
    assert cli.json("approve", tid)["effects"] == REFUND_AND_EMAIL


def test_cancel_of_a_held_run_ends_it_and_nothing_carries_it_on(cli: Cli) -> None:
    tid = cli.held_run()["trajectory_id"]
    out = cli.json("cancel", tid)
    assert out["state"] == "CANCELED" and out["stop_reason"] == "canceled"
    before = cli.stored(tid)
    late = cli("resume", tid)
    assert late.returncode == 2 and "run has ended" in said(late)
    assert cli.stored(tid) == before


@pytest.mark.parametrize("command", ["approve", "deny", "pause", "resume", "cancel"])
def test_an_unknown_id_is_refused_by_name_and_no_store_is_created(cli: Cli, command: str) -> None:
    p = cli(command, "traj-nope")
    assert p.returncode == 2 and p.stdout == ""
    assert "traj-nope" in said(p) and "embedded store" in said(p)
    assert not cli.path.exists(), "a refused command leaves no empty store behind"


def test_an_unknown_id_in_an_existing_store_is_refused_by_name(cli: Cli) -> None:
    cli.held_run()
    p = cli("approve", "traj-nope")
    assert p.returncode == 2 and "traj-nope" in said(p) and "tenant 'default'" in said(p)


def test_a_reviewer_the_agent_does_not_name_is_refused_and_nothing_changes(cli: Cli) -> None:
    tid = cli.held_run()["trajectory_id"]
    before = cli.stored(tid)
    p = cli("approve", tid, "--reviewer", "mallory")
    assert p.returncode == 2 and "mallory" in said(p) and "nothing was changed" in said(p)
    assert cli.stored(tid) == before
