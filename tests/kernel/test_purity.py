"""The step function never changes its input: the runner, replay and the store rely on it."""

from __future__ import annotations

import random

import pytest

import worker.embedded as embedded
from kernel.context import KernelContext, StepResult
from kernel.events import Event
from kernel.record import TrajectoryRecord
from kernel.step import step
from tests.kernel.harness import go
from tests.kernel.random_models import random_backend, random_budget, random_policy, random_rule


def checked_step(rec: TrajectoryRecord, event: Event, ctx: KernelContext) -> StepResult:
    before = rec.to_json()
    result = step(rec, event, ctx)
    assert rec.to_json() == before, f"step changed its input on {event.type}"
    if result.record is not rec:
        assert result.record.record_version > rec.record_version
        assert all(r.record_version == result.record.record_version for r in result.rows)
    return result


@pytest.mark.parametrize("seed", range(150))
def test_step_leaves_its_input_unchanged(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "step", checked_step)
    rng = random.Random(seed)
    r = go(
        random_policy(rng),
        random_budget(rng),
        backend=random_backend(rng),
        on_unknown=random_rule(rng),
    )
    assert r.rec.chain_length == len(r.out.rows)
