"""Hypothesis over the lifecycle: any sequence of requested edges keeps the invariants."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.budget import Budget
from kernel.errors import IllegalTransition, StaleDecision
from kernel.lifecycle import LEGAL, Cause, Decision, transition
from kernel.record import ControlKind, PendingControl, TrajectoryRecord
from kernel.states import TERMINAL, LifecycleState, StopReason

requests = st.lists(
    st.tuples(
        st.sampled_from(list(LifecycleState)),
        st.sampled_from(list(Cause)),
        st.sampled_from([None, *StopReason]),
        st.booleans(),  # use the current version (True) or a stale one
        st.sampled_from([None, ControlKind.PAUSE, ControlKind.CANCEL]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_random_requests_only_move_along_legal_edges(reqs: list) -> None:
    rec = TrajectoryRecord.create(
        trajectory_id="t", tenant="x", user="u", goal="g", agent="a:b", budget=Budget(), now=0
    )
    for i, (target, cause, stop, fresh, hold) in enumerate(reqs):
        rec.pending_control = (
            None
            if hold is None
            else PendingControl(kind=hold, request_id="c", requested_by="o", at=0)
        )
        before_state, before_version = rec.state, rec.record_version
        version = rec.record_version if fresh else rec.record_version - 1
        try:
            transition(
                rec,
                target,
                Decision(decision_id=f"d{i}", seen_version=version, cause=cause, stop=stop),
                0,
            )
        except (IllegalTransition, StaleDecision):
            assert (rec.state, rec.record_version) == (before_state, before_version)
            continue
        assert fresh, "a stale decision must never move the record"
        assert (before_state, target) in LEGAL
        assert before_state not in TERMINAL
        assert rec.record_version == before_version + 1
        if target in TERMINAL:
            assert before_state is LifecycleState.FINALIZING
            assert rec.stop_reason is not None
