"""Replay: the recorded inputs re-run the kernel to the same bytes, without model or tools."""

from __future__ import annotations

from typing import Any

import pytest

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy, new_ids, same_call, search_loop
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.events import ApprovalDecided
from kernel.states import StopReason
from tests.kernel.harness import new_record
from worker.models import ModelReply, ScriptedModel
from worker.recording import ModelInput, Recording, RecordingRunner, replay

CASES: dict[str, tuple[Any, Budget, dict[str, float] | None]] = {
    "A": (RefundPolicy(), Budget(), None),
    "B": (same_call, Budget(), None),
    "C": (new_ids, Budget(), None),
    "D": (search_loop, Budget(max_stalls=10, max_tool_calls=20, max_steps=20), None),
    "E": (RefundPolicy(latency=6.0), Budget(), None),
    "F": (RefundPolicy(), Budget(max_steps=3), None),
    "G": (RefundPolicy("ord_1004", 8000), Budget(), None),
    "H": (RefundPolicy(), Budget(), {"issue_refund": 40.0}),
}


class Counting:
    """Counts calls, to prove replay makes none."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str) -> Any:
        self.calls += 1
        return getattr(self.inner, name)


def record(name: str) -> tuple[Recording, bytes, KernelContext]:
    policy, budget, latency = CASES[name]
    agent = make_agent(budget=budget)
    ctx = KernelContext(agent.profile)
    runner = RecordingRunner(ctx, ScriptedModel(policy), SupportStoreBackend(latency=latency))
    out = runner.start(new_record(budget))
    if out.held is not None:  # G: a reviewer approves exactly the held arguments
        h = out.held
        decision = ApprovalDecided(
            now=out.record.active_s,
            approval_id=h.approval_id,
            held_version=h.held_version,
            digest=h.digest,
            reviewer="reviewer",
            approve=True,
        )
        out = runner.deliver(out.record, decision)
    assert runner.recording is not None
    return runner.recording, out.record.to_json(), ctx


@pytest.mark.parametrize("name", sorted(CASES))
def test_replay_reproduces_the_final_record_byte_for_byte(name: str, tmp_path: Any) -> None:
    recording, final, ctx = record(name)
    path = tmp_path / f"{name}.json"
    recording.save(path)
    again = replay(Recording.load(path), ctx)
    assert again.diverged is None
    assert again.record.to_json() == final


def test_replay_calls_no_model_and_no_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    recording, final, ctx = record("A")
    calls = []
    monkeypatch.setattr(ScriptedModel, "call", lambda *a, **k: calls.append("model"))
    monkeypatch.setattr(SupportStoreBackend, "call", lambda *a, **k: calls.append("tool"))
    assert replay(recording, ctx).record.to_json() == final
    assert calls == []


def test_a_changed_reply_changes_the_outcome() -> None:
    recording, final, ctx = record("A")
    # the fourth reply sent the e-mail; make it a final answer instead
    models = [i for i, x in enumerate(recording.inputs) if x.kind == "model"]
    early = ModelReply.model_validate(
        {
            **recording.inputs[models[3]].reply.model_dump(),  # type: ignore[union-attr]
            "content": {"type": "final", "outcome": "completed", "text": "done early"},
        }
    )
    recording.inputs[models[3]] = ModelInput(reply=early)
    del recording.inputs[models[3] + 1 :]
    result = replay(recording, ctx)
    rec = result.record
    assert result.diverged is not None
    assert rec.to_json() != final
    assert rec.stop_reason is not StopReason.DONE
    assert rec.last_observation == {"status": "error", "code": "plan_incomplete", "detail": ["s3"]}
