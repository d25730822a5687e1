"""`reins limits report` and `reins limits trial` as a user calls them: the seeds' worked
examples through the command line, a store as the source, bad input refused by name."""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import redis

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from ops.limits.sources import Filter, from_store
from ops.limits.stats import Dim
from store.base import TrajectoryStore
from store.redis_store import RedisStore
from store.sqlite import SqliteStore
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel
from worker.resume import store_commit

TASKS = Path(__file__).resolve().parents[2] / "examples" / "support_store" / "tasks.jsonl"


def reins(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **(env or {})},
    )


def report_json(*args: str) -> dict:
    p = reins("limits", "report", *args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def seed_000_runs() -> list[int]:
    """Seed 000, 'Choosing limits': 200 successful runs, 2 + geometric(0.45), at most 20."""
    rng = random.Random(7)
    runs: list[int] = []
    while len(runs) < 200:
        n = 2
        while rng.random() > 0.45:
            n += 1
        if n <= 20:
            runs.append(n)
    return runs


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_seed_000_toy_data(tmp_path: Path) -> None:
    runs = seed_000_runs()
    src = write_csv(
        tmp_path / "runs.csv",
        ["trajectory_id", "accepted", "steps"],
        [[f"t{i}", 1, n] for i, n in enumerate(runs)],
    )
    out = report_json("--from", str(src), "--caps", "steps=4,6,8,10,12")
    steps = out["steps"]
    assert steps["percentiles"] == {"p50": 2, "p90": 5, "p99": 8, "max": 13}
    cut = [c["cut_off_fraction"] for c in steps["caps"]]
    assert cut == [0.16, 0.035, 0.01, 0.005, 0.005]
    assert [c["cap"] for c in steps["caps"]] == [4, 6, 8, 10, 12]
    assert "post-hoc" in out["note"]


def test_seed_004_trial_exercise(tmp_path: Path) -> None:
    groups = [(30, 0.5, 1), (25, 1.5, 1), (15, 3.0, 1), (5, 6.0, 1), (25, 10.0, 0)]
    rows: list[list[object]] = []
    for n, cost, accepted in groups:
        rows += [[f"t{len(rows) + k}", accepted, cost] for k in range(n)]
    src = write_csv(tmp_path / "trial.csv", ["trajectory_id", "accepted", "cost_usd"], rows)
    out = report_json("--from", str(src), "--caps", "dollars=1,2,4,10", "--target-rse", "0.03")
    caps = out["dollars"]["caps"]
    assert [c["accepted"] for c in caps] == [30, 55, 70, 75]
    assert [round(c["cost_per_accepted"], 2) for c in caps] == [2.83, 2.59, 3.11, 5.03]
    assert [round(c["rse"], 3) for c in caps] == [0.153, 0.090, 0.065, 0.058]
    assert out["dollars"]["tasks_for_target_rse"]["2"] == 910
    # the two cheapest caps are within each other's error: a tie, not a winner
    assert caps[0]["tie_with_best"] and caps[1]["tie_with_best"]
    assert not caps[3]["tie_with_best"]


def test_text_report_and_picture(tmp_path: Path) -> None:
    src = write_csv(
        tmp_path / "runs.csv",
        ["accepted", "steps", "cost_usd"],
        [[i % 4 != 0, 2 + i % 7, 0.1 * (1 + i % 5)] for i in range(60)],
    )
    svg = tmp_path / "limits.svg"
    p = reins("limits", "report", "--from", str(src), "--caps", "steps=3,5", "--plot", str(svg))
    assert p.returncode == 0, p.stderr
    assert "post-hoc" in p.stdout and "cost per accepted task by cap" in p.stdout
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert "steps: cost per accepted task" in svg.read_text()


@pytest.mark.parametrize(
    ("header", "rows", "args", "message"),
    [
        (["steps"], [[3]], ["--caps", "steps=4"], "'accepted' column"),
        (["accepted", "steps"], [["maybe", 3]], ["--caps", "steps=4"], ":2: accepted must be"),
        (["accepted", "steps"], [[1, "x"]], ["--caps", "steps=4"], "steps must be a number"),
        (["accepted", "steps"], [[1, -2]], ["--caps", "steps=4"], "finite number >= 0"),
        (["accepted", "steps"], [[1, 3]], ["--caps", "hours=4"], "NAME one of"),
        (["accepted", "steps"], [[1, 3]], ["--caps", "steps=4,x"], "must be numbers"),
        (["accepted", "steps"], [[1, 3]], ["--caps", "steps=0"], "positive numbers"),
        (["accepted", "steps"], [[1, 3]], ["--caps", "dollars=1"], "no run records"),
        (["accepted", "steps"], [[1, 3]], ["--target-rse", "3"], "--target-rse"),
    ],
)
def test_bad_input_is_named(
    tmp_path: Path, header: list[str], rows: list[list[object]], args: list[str], message: str
) -> None:
    src = write_csv(tmp_path / "bad.csv", header, rows)
    p = reins("limits", "report", "--from", str(src), *args)
    assert p.returncode == 2
    assert message in " ".join(p.stderr.split()), p.stderr


def test_bad_task_file_is_named(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"goal": "refund ord_1001"}\n{"gaol": "typo"}\n')
    p = reins(
        "limits",
        "trial",
        "examples.support_store:agent",
        "--tasks",
        str(tasks),
        "--caps",
        "steps=5",
    )
    assert p.returncode == 2
    said = " ".join(p.stderr.split())
    assert "tasks.jsonl:2" in said and "'goal'" in said


def _finished_runs(store: TrajectoryStore) -> list[TrajectoryRecord]:
    """Three refunds run into ``store``: 3 steps cannot finish one, 8 can."""
    records = []
    for i, steps in enumerate([3, 8, 8]):
        budget = Budget(max_steps=steps)
        ctx = KernelContext(make_agent(budget=budget).profile)
        rec = TrajectoryRecord.create(
            trajectory_id=f"t{i}",
            tenant="acme",
            user="cu_ana",
            goal="refund the damaged item on order ord_1001",
            agent="examples.support_store:agent",
            budget=budget,
            now=float(i),
        )
        store.create(rec)
        runner = EmbeddedRunner(
            ctx, ScriptedModel(RefundPolicy()), SupportStoreBackend(), commit=store_commit(store)
        )
        records.append(runner.run(rec).record)
    return records


def _check_store_source(store: TrajectoryStore) -> None:
    """Finished runs read back from a store: accepted exactly when they stopped done, their
    spend the ledger's, the tenant scoping the read."""
    records = _finished_runs(store)
    outcomes = {o.trajectory_id: o for o in from_store(store, "acme")}
    assert set(outcomes) == {"t0", "t1", "t2"}
    for rec in records:
        got = outcomes[rec.trajectory_id]
        assert got.accepted == (rec.stop_reason is not None and rec.stop_reason.value == "done")
        assert got.spend[Dim.STEPS] == rec.ledger.steps.actual
        assert got.spend[Dim.DOLLARS] == float(rec.ledger.dollars.actual)
    assert not outcomes["t0"].accepted and outcomes["t1"].accepted
    assert from_store(store, "other-tenant") == []
    assert [o.trajectory_id for o in from_store(store, "acme", Filter(since=1.0))] == ["t1", "t2"]
    assert from_store(store, "acme", Filter(agent="other:agent")) == []


def test_the_embedded_store_is_a_source(tmp_path: Path) -> None:
    _check_store_source(SqliteStore(str(tmp_path / "reins.db")))
    p = reins(
        "limits",
        "report",
        "--store",
        "sqlite",
        "--tenant",
        "acme",
        "--caps",
        "steps=5,8",
        "--json",
        env={"REINS_SQLITE_PATH": str(tmp_path / "reins.db")},
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["steps"]["accepted"] == 2


def test_the_fleet_store_is_a_source(redis_client: redis.Redis, key_prefix: str) -> None:
    _check_store_source(RedisStore(redis_client, prefix=key_prefix))


def test_trial_of_the_support_store_under_three_step_caps(tmp_path: Path) -> None:
    """Every task of the example set (approvals asked and denied, refunds and e-mails that
    time out) under three step caps, measured as a policy."""
    lines = [json.loads(x) for x in TASKS.read_text().splitlines() if x.strip()]
    assert len(lines) >= 50
    svg = tmp_path / "trial.svg"
    p = reins(
        "limits",
        "trial",
        "examples.support_store:agent",
        "--tasks",
        str(TASKS),
        "--caps",
        "steps=4,5,8",
        "--json",
        "--plot",
        str(svg),
    )
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    rows = {r["cap"]: r for r in out["candidates"]}
    assert sorted(rows) == [4, 5, 8] and out["tasks"] == len(lines)
    slow = sum(1 for t in lines if "backend" in t)
    denied = sum(1 for t in lines if t.get("approve") is False)
    held = sum(1 for t in lines if "8000" in t["goal"] or "9000" in t["goal"])
    for r in rows.values():
        assert r["tasks"] == len(lines)
        # a write whose outcome is unknown or a denied refund is never accepted
        assert r["accepted"] <= len(lines) - slow - denied
        assert sum(r["stop_reasons"].values()) == len(lines)
    # a cap that binds accepts no more than a looser one
    assert rows[4]["accepted"] <= rows[5]["accepted"] <= rows[8]["accepted"]
    assert rows[4]["stop_reasons"].get("max_steps", 0) > 0
    assert rows[8]["accepted"] > 0 and rows[8]["cost_per_accepted"] > 0
    assert rows[8]["approvals_asked"] >= held  # every large refund asked a reviewer
    assert ET.parse(svg).getroot().tag.endswith("svg")


def test_the_api_view_is_a_source() -> None:
    """What the fleet's API shows of a finished run gives the same outcome as its record (the
    API does not show active seconds, so that dimension is absent, not zero)."""
    from api.views import trajectory_of
    from ops.limits.sources import from_api, outcome_of_record

    budget = Budget(max_steps=8)
    ctx = KernelContext(make_agent(budget=budget).profile)
    rec = TrajectoryRecord.create(
        trajectory_id="t-api",
        tenant="acme",
        user="cu_ana",
        goal="refund the damaged item on order ord_1001",
        agent="examples.support_store:agent",
        budget=budget,
        now=0.0,
    )
    done = EmbeddedRunner(ctx, ScriptedModel(RefundPolicy()), SupportStoreBackend()).run(rec)
    views = [trajectory_of(done.record).model_dump(mode="json"), trajectory_of(rec).model_dump()]
    got = from_api(iter([{"items": views, "next_cursor": None}]))
    assert len(got) == 1  # the READY one is not finished
    want = outcome_of_record(done.record)
    assert got[0].accepted and got[0].trajectory_id == "t-api"
    assert got[0].spend == {d: v for d, v in want.spend.items() if d is not Dim.ACTIVE_S}


def test_recordings_are_a_source(tmp_path: Path) -> None:
    """``reins run --record`` files, one or a folder of them, read as finished runs."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, steps in (("a", "3"), ("b", "8")):
        p = reins(
            "run",
            "examples.support_store:agent",
            "--goal",
            "refund ord_1001",
            "--no-store",
            "--budget",
            f"max_steps={steps}",
            "--record",
            str(runs / f"{name}.json"),
            "--json",
        )
        assert p.returncode == 0, p.stderr
    out = report_json("--from", str(runs), "--caps", "steps=5")
    assert out["steps"]["runs"] == 2 and out["steps"]["accepted"] == 1
    one = report_json("--from", str(runs / "b.json"))
    assert one["steps"]["accepted"] == 1
    (tmp_path / "junk.json").write_text("{}")
    p = reins("limits", "report", "--from", str(tmp_path / "junk.json"))
    assert p.returncode == 2 and "not a recording" in " ".join(p.stderr.split())
