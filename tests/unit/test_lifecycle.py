"""The lifecycle: the table's structural invariants, and ``transition`` driven at random.

The table checks state what DESIGN.md invariant 2 asks of the table itself (no trap state, a
guard for every edge, pause only from READY). The properties drive ``transition`` with random
(target, cause, stop, version) requests from every state, with random pending controls, clocks
and admissions that refuse, and check what the code does: a refused request leaves the record
byte for byte as it was, a terminal state is entered only from FINALIZING with a stop reason,
nothing goes from an acting state straight to a terminal one, only a model call's reply stops a
run ``done`` (seed 001 3.2), and a terminal state absorbs.
"""

from __future__ import annotations

import itertools
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.budget import Budget
from kernel.errors import AdmissionRefused, IllegalTransition, StaleDecision
from kernel.lifecycle import GUARDS, LEGAL, Cause, Decision, transition
from kernel.record import ControlKind, PendingControl, TrajectoryRecord
from kernel.states import (
    ACTING,
    LIVE,
    TERMINAL,
    LifecycleState,
    StopReason,
    terminal_state_for,
)

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


# --- the table -------------------------------------------------------------------------------


def test_nine_states() -> None:
    assert len(S) == 9
    assert LIVE | TERMINAL | {S.FINALIZING} == set(S)


def test_no_trap_state_every_live_state_reaches_a_terminal() -> None:
    for s in set(S) - TERMINAL:
        assert successors(s), f"{s} is a trap"
        assert reachable(s) & TERMINAL, f"{s} cannot reach a terminal state"


def test_every_legal_edge_has_a_guard_and_no_guard_is_off_table() -> None:
    assert set(GUARDS) == set(LEGAL)


def test_pause_enters_only_from_ready() -> None:
    assert {a for (a, b) in LEGAL if b is S.PAUSED} == {S.READY}


# --- transition, driven ----------------------------------------------------------------------


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


def placed(state: S, stop: StopReason | None) -> TrajectoryRecord:
    """A fresh record put in ``state``; past FINALIZING it carries the stop that led there."""
    rec = make()
    rec.state = state
    if state is S.FINALIZING or state in TERMINAL:
        rec.stop_reason = stop or StopReason.FAILED
    return rec


def refuse(rec: TrajectoryRecord) -> None:
    raise AdmissionRefused("steps", 1, 0)


STOPS = st.sampled_from([None, *StopReason])
CONTROLS = st.sampled_from([None, ControlKind.PAUSE, ControlKind.CANCEL])


def request(data: st.DataObject, state: S) -> tuple[S, Cause, StopReason | None]:
    """Half the time an edge of the table (so walks go deep), otherwise any target."""
    options = sorted(successors(state)) or list(S)
    target = data.draw(st.sampled_from(options) | st.sampled_from(list(S)))
    return target, data.draw(st.sampled_from(list(Cause))), data.draw(STOPS)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_requests_from_every_state_keep_the_lifecycle_invariants(
    data: st.DataObject,
) -> None:
    start = data.draw(st.sampled_from(list(S)), label="start")
    rec = placed(start, data.draw(STOPS))
    path = [rec.state]
    for i in range(data.draw(st.integers(1, 30), label="requests")):
        hold = data.draw(CONTROLS)
        rec.pending_control = (
            None
            if hold is None
            else PendingControl(kind=hold, request_id="c", requested_by="o", at=0)
        )
        target, cause, stop = request(data, rec.state)
        fresh = data.draw(st.booleans())
        now = data.draw(st.sampled_from([0.0, rec.budget.wall_clock_s]))
        admit = refuse if data.draw(st.integers(0, 3)) == 0 else None
        version = rec.record_version if fresh else rec.record_version - 1
        source, before = rec.state, rec.to_json()
        decision = Decision(decision_id=f"d{i}", seen_version=version, cause=cause, stop=stop)
        try:
            transition(rec, target, decision, now, admit=admit)
        except (IllegalTransition, StaleDecision, AdmissionRefused):
            assert rec.to_json() == before, f"a refused {source} -> {target} changed the record"
            continue
        path.append(rec.state)
        assert source not in TERMINAL, f"terminal {source} did not absorb: -> {target}"
        assert fresh and admit is None, "a stale or refused decision moved the record"
        assert rec.state is target and rec.record_version == version + 1
        if target in TERMINAL:
            assert source is S.FINALIZING, f"{source} -> {target} skipped FINALIZING: {path}"
            assert rec.stop_reason is not None, f"ended in {target} with no stop reason"
        if source in ACTING:
            assert target not in TERMINAL, (source, target)
        if target is S.FINALIZING:
            assert rec.stop_reason is not None, "FINALIZING entered with no stop reason"
            if rec.stop_reason is StopReason.DONE:  # seed 001 3.2: acting -> completed
                assert source is S.CALLING_MODEL, f"done decided in {source}: {path}"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_terminal_state_absorbs_every_request(data: st.DataObject) -> None:
    rec = placed(data.draw(st.sampled_from(sorted(TERMINAL))), data.draw(STOPS))
    for i in range(data.draw(st.integers(1, 20))):
        target = data.draw(st.sampled_from(list(S)))
        cause, stop = data.draw(st.sampled_from(list(Cause))), data.draw(STOPS)
        before = rec.to_json()
        decision = Decision(f"d{i}", rec.record_version, cause, stop)
        with pytest.raises(IllegalTransition):
            transition(rec, target, decision, 0.0)
        assert rec.to_json() == before


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Cause)), STOPS), max_size=40))
def test_a_greedy_walk_from_ready_ends_only_through_finalizing_with_its_stop(
    steps: list[tuple[Cause, StopReason | None]],
) -> None:
    """Each request tries the exits first (terminal states, then FINALIZING, then the live
    states), so any shortcut to an end is taken; a closing stop and finish end every walk."""
    rec, seen = make(), [S.READY]
    # done ends a walk standing in CALLING_MODEL; anywhere else it is refused and cancel ends it
    closing = [
        (Cause.STOP, StopReason.DONE),
        (Cause.STOP, StopReason.CANCELED),
        (Cause.FINISH, None),
    ]
    for i, (cause, stop) in enumerate([*steps, *closing]):
        for target in (*sorted(TERMINAL), S.FINALIZING, *sorted(LIVE)):
            try:
                transition(rec, target, Decision(f"d{i}", rec.record_version, cause, stop), 0.0)
            except IllegalTransition:
                continue
            seen.append(target)
            break
    assert rec.state in TERMINAL, seen
    assert [s for s in seen if s in TERMINAL] == [rec.state], "a terminal state absorbs"
    assert seen[-2] is S.FINALIZING and seen.count(S.FINALIZING) == 1, seen
    assert rec.stop_reason is not None and rec.state is terminal_state_for(rec.stop_reason)


def test_each_edge_fires_and_a_refused_admission_changes_nothing() -> None:
    """Exhaustive over (edge, cause, stop): each table edge fires for some decision, and the
    same decision with an ``admit`` that refuses raises and changes nothing."""
    pause = PendingControl(kind=ControlKind.PAUSE, request_id="p", requested_by="o", at=0)
    fired = set()
    for (a, b), cause, stop, pending in itertools.product(
        sorted(LEGAL), Cause, [None, *StopReason], [None, pause]
    ):
        rec = placed(a, stop)
        rec.pending_control = pending
        decision = Decision("d", rec.record_version, cause, stop)
        try:
            transition(rec, b, decision, 0.0)
        except IllegalTransition:
            continue
        fired.add((a, b))
        rec = placed(a, stop)
        rec.pending_control = pending
        before = rec.to_json()
        with pytest.raises(AdmissionRefused):
            transition(rec, b, decision, 0.0, admit=refuse)
        assert rec.to_json() == before, f"a refused {a} -> {b} changed the record"
    assert fired == set(LEGAL), f"edges that never fire: {set(LEGAL) - fired}"


# --- named cases -----------------------------------------------------------------------------
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


@pytest.mark.parametrize("state", sorted(LIVE - {S.CALLING_MODEL}))
def test_done_is_refused_from_every_state_but_a_model_call(state: S) -> None:
    """Seed 001 3.2: no tool result, wait, pause or admission completes a run; the table
    refuses it, whatever the call site asks, and any other stop still leaves."""
    rec = placed(state, None)
    before = rec.to_json()
    with pytest.raises(IllegalTransition, match="cannot complete"):
        done = Decision("d1", rec.record_version, Cause.STOP, StopReason.DONE)
        transition(rec, S.FINALIZING, done, 0.0)
    assert rec.to_json() == before
    failed = Decision("d2", rec.record_version, Cause.STOP, StopReason.FAILED)
    transition(rec, S.FINALIZING, failed, 0.0)
    assert rec.stop_reason is StopReason.FAILED


def test_done_from_a_model_call_completes() -> None:
    rec = placed(S.CALLING_MODEL, None)
    v = rec.record_version
    transition(rec, S.FINALIZING, Decision("d1", v, Cause.STOP, StopReason.DONE), 0.0)
    transition(rec, S.COMPLETED, Decision("d2", v + 1, Cause.FINISH), 0.0)
    assert rec.state is S.COMPLETED
