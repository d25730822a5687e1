"""The bounded scratchpad: the seed's arithmetic, the two rules, and compaction in the kernel
as a funded, recorded model call that replay reproduces."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import pytest

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import search_loop
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.context import KernelContext
from kernel.render import render
from kernel.scratchpad import (
    PadStep,
    Scratchpad,
    ScratchpadPolicy,
    fold,
    steps_to_fold,
    tokens,
)
from kernel.states import StopReason
from kernel.trace import spans_from_chain
from tests.kernel.harness import new_record
from worker.models import ScriptedModel
from worker.recording import Recording, RecordingRunner, replay

B, A = 1_000, 2_000  # seed 001 section 4.1: the base prompt and what each step adds


def run_costs(steps: int, policy: ScratchpadPolicy, summary: int = 500) -> list[int]:
    """The input tokens of every model call of an ``steps``-step run, compactions included,
    driving the scratchpad functions the kernel uses; each step adds A tokens."""
    pad, costs = Scratchpad(), []
    for i in range(1, steps + 1):
        count = steps_to_fold(pad, B, policy)
        if count:
            costs.append(sum(s.tokens for s in pad.steps[:count]) + pad.summary_tokens)
            fold(pad, count, "s" * summary, lambda text: len(text))
        costs.append(B + tokens(pad))
        pad.steps.append(PadStep(turn=i, text="", tokens=A))
    return costs


def test_the_seeds_scratchpad_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    unbounded = ScratchpadPolicy()
    assert sum(run_costs(10, unbounded)) == 100_000
    assert sum(run_costs(20, unbounded)) == 400_000  # twice the steps, four times the input
    cap = 10_000
    bounded = ScratchpadPolicy(max_tokens=cap, window=2)
    totals = {}
    print("steps  unbounded    capped  calls")
    for n in (10, 20, 40):
        costs = run_costs(n, bounded)
        totals[n] = sum(costs)
        # every call's input is at most the cap plus the verbatim window
        assert max(costs) <= cap + bounded.window * A
        print(f"{n:5d} {sum(run_costs(n, unbounded)):10,d} {totals[n]:9,d} {len(costs):6d}")
    # linear: each further 20 steps costs twice what 10 did, to within one call's input
    # (compactions fall at different points of the cycle); unbounded, the difference is 1.2M
    assert abs((totals[40] - totals[20]) - 2 * (totals[20] - totals[10])) <= cap
    assert sum(run_costs(40, unbounded)) == 40 * B + A * 40 * 39 // 2
    assert "40" in capsys.readouterr().out


def test_rule_1_the_recent_window_is_never_folded_away() -> None:
    policy = ScratchpadPolicy(max_tokens=100, window=2)
    pad = Scratchpad(steps=[PadStep(turn=i, text="", tokens=500) for i in (1, 2)])
    assert steps_to_fold(pad, 50, policy) == 0  # over the cap, but only the window is left
    pad.steps.insert(0, PadStep(turn=0, text="", tokens=500))
    assert steps_to_fold(pad, 50, policy) == 1  # only what lies before the window


def test_a_policy_that_keeps_no_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window"):
        ScratchpadPolicy(max_tokens=100, window=0)
    with pytest.raises(ValueError, match="max_scratchpad_tokens"):
        ScratchpadPolicy(max_tokens=0)


# --- in the kernel ---------------------------------------------------------------------------

CAP = 4_000
BUDGET = Budget(
    max_steps=24,
    max_tool_calls=30,
    max_stalls=30,
    max_repeat=30,
    max_tokens=2_000_000,
    deadline_s=600.0,
    max_cost=Decimal("100"),
)


def recorded(policy: ScratchpadPolicy | None) -> tuple[Recording, bytes, KernelContext]:
    agent = make_agent(budget=BUDGET)
    profile = dataclasses.replace(agent.profile, scratchpad=policy)
    ctx = KernelContext(profile)
    runner = RecordingRunner(ctx, ScriptedModel(search_loop), SupportStoreBackend())
    out = runner.start(new_record(BUDGET))
    assert runner.recording is not None
    return runner.recording, out.record.to_json(), ctx


def test_compaction_is_a_funded_call_that_keeps_every_step_in_the_chain(tmp_path: Path) -> None:
    policy = ScratchpadPolicy(max_tokens=CAP, window=1)
    recording, final, ctx = recorded(policy)
    again = replay(recording, ctx)
    rec = again.record
    assert rec.stop_reason is StopReason.MAX_STEPS
    pad = rec.scratchpad
    assert pad is not None and pad.folded > 0 and pad.summary
    rows = recording_rows(recording, ctx)
    models = [r for r in rows if r.kind is RowKind.MODEL]
    compactions = [r for r in models if (r.detail or {}).get("purpose") == "compaction"]
    steps = [r for r in models if r not in compactions]
    assert compactions, "no compaction was commanded"
    # funded: each compaction is a model call booked against the budget like any other
    assert rec.ledger.steps.actual == len(models)
    # rule 2: the chain keeps every step, the folded ones included
    tools = [r for r in rows if r.kind is RowKind.TOOL]
    assert len(tools) >= len(steps) - 1 > pad.folded
    # bounded: no step's input passed the cap by more than the verbatim window
    window = max(s.tokens for s in pad.steps) * policy.window
    assert max(r.tokens_in for r in steps) <= CAP + window
    # the trace shows each compaction as its own span
    names = [s.name for s in spans_from_chain(rows)]
    assert sum(n.startswith("compact") for n in names) == len(compactions)
    # replay folds the same recorded summaries into the same record
    path = tmp_path / "run.json"
    recording.save(path)
    assert replay(Recording.load(path), ctx).record.to_json() == final


def recording_rows(recording: Recording, ctx: KernelContext) -> list:  # type: ignore[type-arg]
    return replay(recording, ctx).rows


def test_without_a_cap_the_scratchpad_grows_and_nothing_is_compacted() -> None:
    recording, _, ctx = recorded(ScratchpadPolicy())
    rows = recording_rows(recording, ctx)
    assert not [r for r in rows if (r.detail or {}).get("purpose") == "compaction"]
    ins = [r.tokens_in for r in rows if r.kind is RowKind.MODEL]
    assert ins == sorted(ins) and ins[-1] > 3 * CAP  # the quadratic term, unbounded


def test_without_a_scratchpad_the_view_is_the_state_alone() -> None:
    recording, _, ctx = recorded(None)
    rec = replay(recording, ctx).record
    assert rec.scratchpad is None and "history" not in render(rec)
