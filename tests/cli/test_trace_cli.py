"""`reins trace FILE` and `reins replay FILE` on a recorded run."""

from __future__ import annotations

import json
from pathlib import Path

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import same_call
from kernel.context import KernelContext
from tests.cli.test_run_cli import reins
from tests.kernel.harness import new_record
from worker.models import ScriptedModel
from worker.recording import RecordingRunner


def recorded(tmp_path: Path) -> Path:
    agent = make_agent()
    runner = RecordingRunner(
        KernelContext(agent.profile), ScriptedModel(same_call), SupportStoreBackend()
    )
    runner.start(new_record(agent.profile.budget))
    assert runner.recording is not None
    path = tmp_path / "b.json"
    runner.recording.save(path)
    return path


def test_trace_prints_tree_and_postmortem(tmp_path: Path) -> None:
    path = recorded(tmp_path)
    p = reins("trace", str(path))
    assert p.returncode == 0, p.stderr
    assert "execute_tool get_order" in p.stdout and "post-mortem" in p.stdout
    j = json.loads(reins("trace", str(path), "--json").stdout)
    assert j["postmortem"]["most_repeated"] == ["get_order", {"order_id": "ord_9999"}, 2]


def test_replay_is_identical(tmp_path: Path) -> None:
    out = json.loads(reins("replay", str(recorded(tmp_path)), "--json").stdout)
    assert out["identical_to_recorded"] is True and out["diverged"] is None
    assert out["stop_reason"] == "repeated_call"


def test_replay_of_a_missing_file_says_what_to_do(tmp_path: Path) -> None:
    p = reins("replay", str(tmp_path / "nope.json"))
    assert p.returncode == 2 and "no such recording" in p.stderr
