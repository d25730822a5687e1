"""The lifecycle table: legal edges, a guard per edge, and the one way to change state.

An event proposes an edge; the guard, evaluated against the record at that moment, decides
whether it fires (seed 004 listing 1). An edge without a guard is refused by default. A
decision formed on an older ``record_version`` is refused as stale. Terminal states absorb,
every exit passes FINALIZING, and nothing goes from an acting state straight to a terminal one;
only a model call's reply may stop a run ``done`` (no tool result or wait completes it).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import NamedTuple

from kernel.errors import IllegalTransition, StaleDecision
from kernel.fastmodel import pinned_values
from kernel.record import ApprovalStatus, ControlKind, SettlementOwner, TrajectoryRecord
from kernel.states import LIVE, TERMINAL, LifecycleState, StopReason, terminal_state_for

S = LifecycleState


@pinned_values
class Cause(StrEnum):
    """Why a transition is requested; guards check that the cause fits the edge."""

    ADMIT = "admit"  # admission of the next model call
    REPLY_TOOLS = "reply_tools"  # a completed reply whose tool calls were admitted
    REPLY_APPROVAL = "reply_approval"  # a completed reply whose action is held for review
    REPLY_OBSERVE = "reply_observe"  # any other reply: back to READY with an observation
    WAIT_SATISFIED = "wait_satisfied"  # the wait policy of WAITING_TOOL is met
    WITHDRAWN = "withdrawn"  # a wait or approval withdrawn (deadline, control, expiry, denial)
    APPROVED = "approved"  # an approval decision whose dispatch was admitted
    RELEASED = "released"  # an operator lifted the freeze or grant that held a write
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"  # any exit: completion request, budget, stall, control, failure
    FINISH = "finish"  # finalization complete: enter the terminal state


LEGAL: frozenset[tuple[S, S]] = frozenset(
    {
        (S.READY, S.CALLING_MODEL),
        (S.READY, S.PAUSED),
        (S.CALLING_MODEL, S.READY),
        (S.CALLING_MODEL, S.WAITING_TOOL),
        (S.CALLING_MODEL, S.AWAITING_APPROVAL),
        (S.WAITING_TOOL, S.READY),
        (S.AWAITING_APPROVAL, S.WAITING_TOOL),
        (S.AWAITING_APPROVAL, S.READY),
        (S.PAUSED, S.READY),
    }
    | {(s, S.FINALIZING) for s in LIVE}
    | {(S.FINALIZING, t) for t in TERMINAL}
)


class Decision(NamedTuple):
    """A request to move along one edge, formed on a record version the caller saw."""

    decision_id: str
    seen_version: int
    cause: Cause
    stop: StopReason | None = None


Guard = Callable[[TrajectoryRecord, Decision, float], str | None]
"""A guard returns None to permit the edge, or the reason it refuses."""


def _no_pending_control(rec: TrajectoryRecord) -> str | None:
    if rec.pending_control is not None:
        return f"control {rec.pending_control.kind.value} is pending"
    return None


def _cause(*allowed: Cause) -> Guard:
    def guard(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
        return None if d.cause in allowed else f"cause {d.cause.value} does not fit this edge"

    return guard


def _all(*guards: Guard) -> Guard:
    def guard(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
        for g in guards:
            why = g(rec, d, now)
            if why is not None:
                return why
        return None

    return guard


def clock_refusal(rec: TrajectoryRecord, now: float) -> str | None:
    """Why the active-time deadline or the wall-clock limit refuses new work, or None."""
    if rec.active_s >= rec.budget.deadline_s:
        return "active-time deadline has passed"
    if now - rec.submitted_at >= rec.budget.wall_clock_s:
        return "wall-clock limit has passed"
    return None


def clock_stop(rec: TrajectoryRecord, now: float) -> StopReason | None:
    """The stop of the first clock that ran out at ``now`` (the wall clock's first), or None."""
    if now - rec.submitted_at >= rec.budget.wall_clock_s:
        return StopReason.WALL_CLOCK
    if rec.active_s >= rec.budget.deadline_s:
        return StopReason.DEADLINE
    return None


def time_left(rec: TrajectoryRecord, now: float) -> float:
    """The smallest remaining allowance of the two clocks at ``now``, in seconds (six places):
    every call's timeout, so no call runs past the end of either (seed 000: "the remaining
    time becomes the timeout")."""
    budget = rec.budget
    wall = budget.wall_clock_s - (now - rec.submitted_at)
    return round(min(budget.deadline_s - rec.active_s, wall), 6)


def _clocks(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
    return clock_refusal(rec, now)


def _admission(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
    """The non-budget part of the admission check; the ledger adds the budget clause."""
    if (why := _no_pending_control(rec)) is not None:
        return why
    if rec.held is not None and rec.held.status is ApprovalStatus.HELD:
        return "a proposal is held for approval"
    return _clocks(rec, d, now)


def _no_pending(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
    return _no_pending_control(rec)


def _pause_entry(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
    pc = rec.pending_control
    if pc is None or pc.kind is not ControlKind.PAUSE:
        return "no pause is pending"
    return None


def _stop(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
    if d.stop is None:
        return "a stop needs a stop reason"
    if d.stop is StopReason.DONE and rec.state is not S.CALLING_MODEL:
        # Seed 001 3.2: acting -> completed is illegal. An answer exists only once a model
        # step has observed what the tools returned: a run completes on a model's reply.
        return f"done is a model reply's: a run in {rec.state.value} cannot complete"
    return None


def _finish(target: S) -> Guard:
    def guard(rec: TrajectoryRecord, d: Decision, now: float) -> str | None:
        if rec.stop_reason is None:
            return "no stop reason recorded"
        if terminal_state_for(rec.stop_reason) is not target:
            return f"stop {rec.stop_reason.value} does not end in {target.value}"
        if target is S.COMPLETED:  # completion owes nothing: no transfer counts
            owed = [op.op_id for op in rec.operations.values() if op.open]
        else:  # any other end may transfer what is open to the reconciler
            kernel = SettlementOwner.KERNEL
            owed = [op.op_id for op in rec.open_operations if op.settlement_owner is kernel]
        if owed:
            return "operations not settled or handed off: " + ", ".join(owed)
        return None

    return guard


GUARDS: dict[tuple[S, S], Guard] = {
    (S.READY, S.CALLING_MODEL): _all(_cause(Cause.ADMIT), _admission),
    (S.READY, S.PAUSED): _all(_cause(Cause.PAUSE), _pause_entry),
    (S.CALLING_MODEL, S.READY): _cause(Cause.REPLY_OBSERVE, Cause.WITHDRAWN),
    (S.CALLING_MODEL, S.WAITING_TOOL): _all(_cause(Cause.REPLY_TOOLS), _no_pending, _clocks),
    (S.CALLING_MODEL, S.AWAITING_APPROVAL): _all(_cause(Cause.REPLY_APPROVAL), _no_pending),
    (S.WAITING_TOOL, S.READY): _cause(Cause.WAIT_SATISFIED, Cause.WITHDRAWN),
    (S.AWAITING_APPROVAL, S.WAITING_TOOL): _all(
        _cause(Cause.APPROVED, Cause.RELEASED), _no_pending, _clocks
    ),
    (S.AWAITING_APPROVAL, S.READY): _cause(Cause.WITHDRAWN),
    (S.PAUSED, S.READY): _cause(Cause.RESUME),
    **{(s, S.FINALIZING): _all(_cause(Cause.STOP), _stop) for s in LIVE},
    **{(S.FINALIZING, t): _all(_cause(Cause.FINISH), _finish(t)) for t in TERMINAL},
}


def transition(
    rec: TrajectoryRecord,
    target: S,
    decision: Decision,
    now: float,
    admit: Callable[[TrajectoryRecord], None] | None = None,
) -> None:
    """Move ``rec`` to ``target`` in place, or raise and leave it unchanged.

    Checks, in order: the edge is legal and has a guard; the guard permits it; the decision
    was made on the current version. Then ``admit`` (reservations, registration) runs, and
    may itself refuse by raising; only then do the state and the version change.
    """
    edge = (rec.state, target)
    guard = GUARDS.get(edge)
    if edge not in LEGAL or guard is None:
        raise IllegalTransition(rec.state.value, target.value, decision.decision_id, "not in table")
    why = guard(rec, decision, now)
    if why is not None:
        raise IllegalTransition(rec.state.value, target.value, decision.decision_id, why)
    if decision.seen_version != rec.record_version:
        raise StaleDecision(decision.decision_id, decision.seen_version, rec.record_version)
    if admit is not None:
        admit(rec)
    if target is S.FINALIZING and decision.stop is not None and rec.stop_reason is None:
        rec.stop_reason = decision.stop
    rec.state = target
    rec.record_version += 1
