"""Seed 000 "Suspending and resuming": G is held, approved for exactly its arguments, and the
saved snapshot is resumed twice. One refund and one e-mail in total, either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.errors import ConcurrentModification
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from store.base import TrajectoryStore
from store.in_process import InProcessStore
from store.sqlite import SqliteStore
from tests.kernel.harness import new_record
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel

EFFECTS = [["refund", "ord_1004", 8000], ["email", "ord_1004"]]


def runner(store: TrajectoryStore | None, backend: SupportStoreBackend) -> EmbeddedRunner:
    def commit(prev: TrajectoryRecord, new: TrajectoryRecord, rows: list[ChainRow]) -> None:
        assert store is not None
        store.compare_and_set(new, prev.record_version, rows)

    ctx = KernelContext(make_agent().profile)
    return EmbeddedRunner(
        ctx,
        ScriptedModel(RefundPolicy("ord_1004", 8000)),
        backend,
        commit=commit if store is not None else None,
    )


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TrajectoryStore:
    return InProcessStore() if request.param == "memory" else SqliteStore(str(tmp_path / "r.db"))


def test_second_resume_of_the_same_version_is_refused_by_the_store(store: TrajectoryStore) -> None:
    backend = SupportStoreBackend()
    rec = new_record(make_agent().profile.budget)
    store.create(rec)
    first = runner(store, backend).run(rec)
    assert first.record.state is LifecycleState.AWAITING_APPROVAL and backend.effects() == []
    saved = store.load("acme", "t1")  # the snapshot a second worker would also load
    assert first.held is not None and saved.held is not None
    assert saved.held.args == {"order_id": "ord_1004", "amount_cents": 8000, "reason": "damaged"}
    done = runner(store, backend).approve(saved, first.held)
    assert done.record.stop_reason is StopReason.DONE
    with pytest.raises(ConcurrentModification) as lost:
        runner(store, backend).approve(saved, first.held)
    assert lost.value.current_version == done.record.record_version
    assert backend.effects() == EFFECTS
    assert store.load("acme", "t1").stop_reason is StopReason.DONE


def test_resuming_two_copies_outside_any_store_replays_by_call_key() -> None:
    backend = SupportStoreBackend()
    first = runner(None, backend).run(new_record(make_agent().profile.budget))
    saved = first.record.to_json()  # the process could exit here
    held = first.held
    assert held is not None
    a = runner(None, backend).approve(TrajectoryRecord.from_json(saved), held)
    b = runner(None, backend).approve(TrajectoryRecord.from_json(saved), held)
    assert a.record.stop_reason is StopReason.DONE and b.record.stop_reason is StopReason.DONE
    keys = {op.tool: op.idempotency_key for op in b.record.operations.values() if op.tool}
    assert keys["issue_refund"].startswith("t1:s2:issue_refund:")
    assert backend.effects() == EFFECTS, "the second resume's calls replayed stored results"
    assert (a.record.turn, a.record.tool_dispatches, a.record.active_s) == (
        5,
        3,
        pytest.approx(10.0),
    )
