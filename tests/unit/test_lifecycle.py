"""The lifecycle table, proved by iterating it, and the transition procedure."""

from __future__ import annotations

from collections import deque

import pytest

from kernel.budget import Budget
from kernel.errors import IllegalTransition, StaleDecision
from kernel.lifecycle import GUARDS, LEGAL, Cause, Decision, transition
from kernel.record import ControlKind, PendingControl, TrajectoryRecord
from kernel.states import ACTING, LIVE, TERMINAL, LifecycleState, StopReason

S = LifecycleState


def successors(state: S) -> set[S]:
    return {b for (a, b) in LEGAL if a is state}


def reachable(start: S) -> set[S]:
    seen, todo = {start}, deque([start])
    while todo:
        for nxt in successors(todo.popleft()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_nine_states() -> None:
    assert len(S) == 9
    assert LIVE | TERMINAL | {S.FINALIZING} == set(S)


def test_terminal_states_absorb() -> None:
    for t in TERMINAL:
        assert successors(t) == set(), t


def test_no_trap_state_every_live_state_reaches_a_terminal() -> None:
    for s in set(S) - TERMINAL:
        assert successors(s), f"{s} is a trap"
        assert reachable(s) & TERMINAL, f"{s} cannot reach a terminal state"


def test_no_edge_from_acting_to_terminal() -> None:
    for a, b in LEGAL:
        if a in ACTING:
            assert b not in TERMINAL, (a, b)


def test_every_exit_passes_finalizing() -> None:
    for a, b in LEGAL:
        if b in TERMINAL:
            assert a is S.FINALIZING, (a, b)
    for s in LIVE:
        assert (s, S.FINALIZING) in LEGAL


def test_every_legal_edge_has_a_guard_and_no_guard_is_off_table() -> None:
    assert set(GUARDS) == set(LEGAL)


def test_pause_enters_only_from_ready() -> None:
    assert {a for (a, b) in LEGAL if b is S.PAUSED} == {S.READY}


def make(now: float = 0.0) -> TrajectoryRecord:
    return TrajectoryRecord.create(
        trajectory_id="t1",
        tenant="acme",
        user="cu_ana",
        goal="g",
        agent="a:b",
        budget=Budget(),
        now=now,
    )


def test_legal_admission_moves_and_bumps_version() -> None:
    rec = make()
    transition(
        rec, S.CALLING_MODEL, Decision(decision_id="d1", seen_version=1, cause=Cause.ADMIT), 0
    )
    assert rec.state is S.CALLING_MODEL
    assert rec.record_version == 2


def test_stale_decision_is_refused_and_changes_nothing() -> None:
    rec = make()
    before = rec.to_json()
    with pytest.raises(StaleDecision) as info:
        transition(
            rec, S.CALLING_MODEL, Decision(decision_id="d", seen_version=7, cause=Cause.ADMIT), 0
        )
    assert info.value.current_version == 1
    assert rec.to_json() == before


def test_edge_not_in_table_is_refused() -> None:
    rec = make()
    with pytest.raises(IllegalTransition, match="not in table"):
        transition(
            rec, S.COMPLETED, Decision(decision_id="d", seen_version=1, cause=Cause.FINISH), 0
        )
    assert rec.state is S.READY and rec.record_version == 1


def test_guard_refuses_wrong_cause() -> None:
    rec = make()
    with pytest.raises(IllegalTransition, match="cause"):
        transition(
            rec, S.CALLING_MODEL, Decision(decision_id="d", seen_version=1, cause=Cause.RESUME), 0
        )


def test_pending_control_blocks_admission() -> None:
    rec = make()
    rec.pending_control = PendingControl(
        kind=ControlKind.PAUSE, request_id="p", requested_by="op", at=0
    )
    with pytest.raises(IllegalTransition, match="pause"):
        transition(
            rec, S.CALLING_MODEL, Decision(decision_id="d", seen_version=1, cause=Cause.ADMIT), 0
        )
    transition(rec, S.PAUSED, Decision(decision_id="p", seen_version=1, cause=Cause.PAUSE), 0)
    assert rec.state is S.PAUSED


def test_wall_clock_blocks_admission() -> None:
    rec = make(now=100.0)
    later = 100.0 + rec.budget.wall_clock_s
    with pytest.raises(IllegalTransition, match="wall-clock"):
        transition(
            rec,
            S.CALLING_MODEL,
            Decision(decision_id="d", seen_version=1, cause=Cause.ADMIT),
            later,
        )


def test_finalizing_needs_a_stop_and_terminal_matches_it() -> None:
    rec = make()
    with pytest.raises(IllegalTransition):
        transition(
            rec, S.FINALIZING, Decision(decision_id="d", seen_version=1, cause=Cause.STOP), 0
        )
    transition(
        rec,
        S.FINALIZING,
        Decision(decision_id="d", seen_version=1, cause=Cause.STOP, stop=StopReason.MAX_STEPS),
        0,
    )
    with pytest.raises(IllegalTransition, match="does not end in COMPLETED"):
        transition(
            rec, S.COMPLETED, Decision(decision_id="f", seen_version=2, cause=Cause.FINISH), 0
        )
    transition(rec, S.FAILED, Decision(decision_id="f", seen_version=2, cause=Cause.FINISH), 0)
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_STEPS
