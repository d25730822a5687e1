"""Decisions on a stored run of the embedded runner (worker.embedded_control): the held request
is decided once, even by two deciders racing on the same loaded version."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.context import KernelContext
from kernel.errors import InvalidInput
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from store.base import TrajectoryStore
from store.in_process import InProcessStore
from store.sqlite import SqliteStore
from tests.kernel.harness import new_record
from worker import embedded_control
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel
from worker.resume import start


def runner(store: TrajectoryStore, rec: TrajectoryRecord) -> EmbeddedRunner:
    ctx = KernelContext(make_agent().profile)
    model = ScriptedModel(RefundPolicy("ord_1004", 8000))
    return embedded_control.runner_for(store, rec, ctx, model, SupportStoreBackend())


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TrajectoryStore:
    return InProcessStore() if request.param == "memory" else SqliteStore(str(tmp_path / "r.db"))


@pytest.fixture
def held(store: TrajectoryStore) -> TrajectoryRecord:
    ctx = KernelContext(make_agent().profile)
    rec = new_record(make_agent().profile.budget)
    model = ScriptedModel(RefundPolicy("ord_1004", 8000))
    out = start(store, rec, ctx, model, SupportStoreBackend())
    assert out.record.state is LifecycleState.AWAITING_APPROVAL
    return store.load("acme", "t1")


def test_the_run_goes_on_from_where_its_clock_stopped(
    store: TrajectoryStore, held: TrajectoryRecord
) -> None:
    assert held.held is not None
    assert embedded_control.reading(store, held) == held.held.held_at > 0


def test_two_deciders_on_one_version_decide_once(
    store: TrajectoryStore, held: TrajectoryRecord
) -> None:
    first = embedded_control.decide(runner(store, held), held, approve=True, reviewer="reviewer")
    assert first.record.stop_reason is StopReason.DONE
    version = store.load("acme", "t1").record_version
    with pytest.raises(InvalidInput, match="nothing was changed") as lost:
        # the second loaded the same version before the first committed
        embedded_control.decide(runner(store, held), held, approve=True, reviewer="reviewer")
    assert lost.value.code == "concurrent_modification"
    assert store.load("acme", "t1").record_version == version


def test_a_decision_on_a_run_that_never_held_one_says_so(store: TrajectoryStore) -> None:
    rec = new_record(make_agent().profile.budget)
    store.create(rec)
    with pytest.raises(embedded_control.DecisionRefused, match="never held an approval"):
        embedded_control.decide(runner(store, rec), rec, approve=True, reviewer="reviewer")


def test_approving_an_approved_request_admission_refused_re_checks_it(
    store: TrajectoryStore, held: TrajectoryRecord
) -> None:
    """No ticker serves the embedded store: a repeated approval is the re-check (table 8)."""
    spent = held.ledger.tool_calls.actual
    held.ledger.tool_calls.actual = held.ledger.tool_calls.allowance  # no room for the refund
    first = embedded_control.decide(runner(store, held), held, approve=True, reviewer="reviewer")
    rec = first.record
    assert rec.state is LifecycleState.AWAITING_APPROVAL and rec.held is not None
    assert rec.held.status.value == "approved", "approved, not admitted: still held"
    rec.ledger.tool_calls.actual = spent  # the room is back
    again = embedded_control.decide(runner(store, rec), rec, approve=True, reviewer="reviewer")
    assert again.record.stop_reason is StopReason.DONE
    rows = [r.outcome for r in first.rows + again.rows if r.kind.value == "approval"]
    assert rows == ["approved_not_admitted", "admitted"], "one decision recorded"
