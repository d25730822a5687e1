"""`reins run` through the local OpenAI-compatible server and through the scripted provider.

The server answers with the same RefundPolicy the scripted provider uses, the same usage
estimate and the same latency, reported in ``openai-processing-ms``; ``--latency-header`` tells
the provider to take each call's latency from that header instead of measuring wall time. With
it, the final records are equal field for field (byte for byte as JSON). Without it, latency is
the measured wall time, and everything but the clock-derived fields is equal.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from examples.support_store.policies import RefundPolicy
from kernel.record import TrajectoryRecord
from ops.cli import run as cli_run
from ops.cli.report import summary as report
from tests.providers.conftest import Serve
from tests.providers.scripts import policy_script

GOAL = "refund the damaged item on order ord_1001"
AGENT = "examples.support_store:agent"
SERVED = ["--provider", "openai-compatible", "--latency-header", "openai-processing-ms"]


def reins(*args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    return out


def test_reins_run_through_the_server_equals_the_scripted_run(serve: Serve) -> None:
    server = serve(policy_script(RefundPolicy.from_goal(GOAL)))
    scripted = reins("run", AGENT, "--goal", GOAL, "--json")
    served = reins("run", AGENT, "--goal", GOAL, "--json", *SERVED, "--base-url", server.base_url)
    assert len(server.seen) == 5  # plan, get_order, issue_refund, send_status_email, final
    assert scripted.pop("trajectory_id") != served.pop("trajectory_id")  # drawn at random
    assert served == scripted
    assert served["stop_reason"] == "done" and served["active_s"] > 0
    assert served["effects"] == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]


def test_final_records_are_equal_field_for_field(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same command in-process, keeping the final record `reins run` reports on."""
    server = serve(policy_script(RefundPolicy.from_goal(GOAL)))
    records: list[TrajectoryRecord] = []

    def keep(rec: TrajectoryRecord, effects: Any = None) -> dict[str, Any]:
        records.append(rec)
        return report(rec, effects)

    monkeypatch.setattr("ops.cli.report.summary", keep)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=10))  # one trajectory id for both
    app = typer.Typer()
    cli_run.register(app)
    runner = CliRunner()
    for extra in ([], [*SERVED, "--base-url", server.base_url]):
        result = runner.invoke(app, ["run", AGENT, "--goal", GOAL, "--json", "--no-store", *extra])
        assert result.exit_code == 0, result.output
    scripted, served = records
    assert served.model_dump() == scripted.model_dump()
    assert served.to_json() == scripted.to_json()
    # 5 model calls x 1.5 s (reported by the server) + 2.5 s of tools
    assert served.ledger.dollars.actual > 0 and served.active_s == 10.0


def test_measured_latency_changes_only_the_clocks(serve: Serve) -> None:
    """Without --latency-header the provider reports measured wall time: every reported
    figure but active time is still the scripted run's."""
    server = serve(policy_script(RefundPolicy.from_goal(GOAL)))
    scripted = reins("run", AGENT, "--goal", GOAL, "--json")
    served = reins(
        "run", AGENT, "--goal", GOAL, "--json", "--provider", "openai-compatible",
        "--base-url", server.base_url,
    )  # fmt: skip
    for out in (scripted, served):
        del out["trajectory_id"], out["active_s"]
    assert served == scripted


def test_the_profile_chooses_the_provider(serve: Serve) -> None:
    """``agent_local`` names an OpenAI-compatible server in its profile; only the URL is
    pointed at this test's server."""
    server = serve(policy_script(RefundPolicy.from_goal(GOAL)))
    out = reins(
        "run", "examples.support_store:agent_local", "--goal", GOAL, "--json",
        "--base-url", server.base_url,
    )  # fmt: skip
    assert out["stop_reason"] == "done" and len(server.seen) == 5
    assert {s.request["model"] for s in server.seen} == {"refund-policy"}


def test_an_unknown_provider_is_refused_by_name() -> None:
    args = ["run", AGENT, "--goal", GOAL, "--provider", "carrier-pigeon"]
    p = subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 2 and "carrier-pigeon" in p.stderr and p.stdout == ""
