"""The lifecycle states of a trajectory and the closed list of stop reasons."""

from __future__ import annotations

from enum import StrEnum

from kernel.fastmodel import pinned_values


@pinned_values
class LifecycleState(StrEnum):
    """The nine states of the supervisory state machine (seed 004, table 3)."""

    READY = "READY"
    CALLING_MODEL = "CALLING_MODEL"
    WAITING_TOOL = "WAITING_TOOL"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    PAUSED = "PAUSED"
    FINALIZING = "FINALIZING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


LIVE = frozenset(
    {
        LifecycleState.READY,
        LifecycleState.CALLING_MODEL,
        LifecycleState.WAITING_TOOL,
        LifecycleState.AWAITING_APPROVAL,
        LifecycleState.PAUSED,
    }
)
TERMINAL = frozenset({LifecycleState.COMPLETED, LifecycleState.FAILED, LifecycleState.CANCELED})
# States in which work the runtime admitted may be running right now.
ACTING = frozenset({LifecycleState.CALLING_MODEL, LifecycleState.WAITING_TOOL})


@pinned_values
class StopReason(StrEnum):
    """Why a run ended: the closed list. Approval is not here: it is a state, not a stop."""

    DONE = "done"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOKENS = "max_tokens"
    MAX_COST = "max_cost"
    DEADLINE = "deadline"
    WALL_CLOCK = "wall_clock"
    REPEATED_CALL = "repeated_call"
    NO_PROGRESS = "no_progress"
    UNKNOWN_OUTCOME = "unknown_outcome"
    CANCELED = "canceled"
    KILLED = "killed"
    FAILED = "failed"


def terminal_state_for(stop: StopReason) -> LifecycleState:
    """The absorbing state a stop reason ends in: done completes, cancel and kill cancel."""
    if stop is StopReason.DONE:
        return LifecycleState.COMPLETED
    if stop in (StopReason.CANCELED, StopReason.KILLED):
        return LifecycleState.CANCELED
    return LifecycleState.FAILED
