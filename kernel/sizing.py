"""Sizing figures: what held approvals cost, and what timed-out jobs leave uncovered.

Little's law prices a wait: the mean number of trajectories held in AWAITING_APPROVAL is the
arrival rate of approval requests times the mean time to a decision (seed 004 section 10.7.1).
It fixes the mean, not the peak: size pools from the arrival pattern, not the mean alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from kernel.amounts import Dimension
from kernel.record import ApprovalStatus, TrajectoryRecord
from kernel.states import LifecycleState


def held_by_littles_law(arrivals_per_hour: float, mean_decision_hours: float) -> float:
    """Mean trajectories held at once."""
    return arrivals_per_hour * mean_decision_hours


def max_mean_decision_hours(pool: float, per_trajectory: float, arrivals_per_hour: float) -> float:
    """The longest mean decision time whose held trajectories fit in ``pool``."""
    return pool / per_trajectory / arrivals_per_hour


@dataclass(frozen=True)
class HeldWorkspaces:
    """What held approvals cost in workspace memory (seed 004, "workspaces held in escrow")."""

    held: float  # mean trajectories in AWAITING_APPROVAL (Little's law)
    retained_gb: float  # the workspace memory they keep, kept whole
    fitting_decision_hours: float  # the longest mean decision whose holds fit the pool
    snapshot_resident_gb: float  # what stays resident when each workspace is snapshotted
    restore_fraction: float  # a snapshot's restore delay over the mean decision time


def held_workspaces(
    arrivals_per_hour: float,
    mean_decision_hours: float,
    workspace_gb: float,
    pool_gb: float,
    resident_gb: float,
    restore_s: float,
) -> HeldWorkspaces:
    """Held approvals' workspaces, kept whole or snapshotted on entering AWAITING_APPROVAL
    (``resident_gb`` of each stays, ``restore_s`` brings it back at dispatch)."""
    held = held_by_littles_law(arrivals_per_hour, mean_decision_hours)
    return HeldWorkspaces(
        held=held,
        retained_gb=held * workspace_gb,
        fitting_decision_hours=max_mean_decision_hours(pool_gb, workspace_gb, arrivals_per_hour),
        snapshot_resident_gb=held * resident_gb,
        restore_fraction=restore_s / (mean_decision_hours * 3600),
    )


@dataclass(frozen=True)
class UsedFractions:
    """What a trajectory has used of each allowance, as fractions (seed 004 napkin 10.3)."""

    steps: float
    tool_calls: float
    tokens: float
    dollars: float
    active_time: float  # model and tool time over the active-time deadline
    wall_clock: float  # time since submission over the wall-clock limit

    def leading(self) -> str:
        """The allowance with the largest used fraction (the first of a tie): it binds first."""
        shares = asdict(self)
        return max(shares, key=shares.__getitem__)


def used_fractions(rec: TrajectoryRecord, now: float) -> UsedFractions:
    """At ``now``: each cumulative dimension's settled plus reserved over its allowance (as
    the ledger counts it), active time over the deadline, and time since submission over the
    wall-clock limit."""
    led, budget = rec.ledger, rec.budget
    return UsedFractions(
        steps=led.used_fraction(Dimension.STEPS),
        tool_calls=led.used_fraction(Dimension.TOOL_CALLS),
        tokens=led.used_fraction(Dimension.TOKENS),
        dollars=led.used_fraction(Dimension.DOLLARS),
        active_time=rec.active_s / budget.deadline_s,
        wall_clock=(now - rec.submitted_at) / budget.wall_clock_s,
    )


@dataclass(frozen=True)
class ApprovalFigures:
    """Held approvals now, their mean decision time, and Little's law estimate."""

    held_now: int
    decided: int
    mean_decision_s: float | None
    arrivals_per_s: float
    littles_law_held: float | None


def approval_figures(
    records: Iterable[TrajectoryRecord], now: float, window_s: float
) -> ApprovalFigures:
    """Figures over the records of a store (one tenant's, or all), within a time window."""
    held_now, decisions, arrivals = 0, [], 0
    for rec in records:
        h = rec.held
        if rec.state is LifecycleState.AWAITING_APPROVAL:
            held_now += 1
        if h is None:
            continue
        if h.held_at >= now - window_s:
            arrivals += 1
        closed = h.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED)
        if closed and h.decided_at is not None:
            decisions.append(h.decided_at - h.held_at)
    mean = sum(decisions) / len(decisions) if decisions else None
    rate = arrivals / window_s if window_s > 0 else 0.0
    return ApprovalFigures(
        held_now=held_now,
        decided=len(decisions),
        mean_decision_s=mean,
        arrivals_per_s=rate,
        littles_law_held=rate * mean if mean is not None else None,
    )


@dataclass(frozen=True)
class TimedOutJobs:
    """Seed 004 exercise "Settling timed-out test jobs", computed from its inputs."""

    liability: float
    defective_uncovered_mean: float
    defective_uncovered_worst: float
    uncovered_mean_share: float  # of the trajectory's dollar allowance
    uncovered_worst_share: float
    held_beyond_charge: float
    cancel_charge: float
    cancel_released: float
    cost_cancel: float
    cost_let_run: float


def timed_out_jobs(
    jobs: int,
    rate_per_s: float,
    cap_s: float,
    wait_s: float,
    p_fast: float,
    fast_s: float,
    slow_s: float,
    cancel_stop_s: float,
    allowance: float,
) -> TimedOutJobs:
    """A job's bound is its cap; a defective harness that releases at the wait's timeout leaves
    every late charge uncovered; the settlement rule holds the bound until the charge."""
    liability = rate_per_s * cap_s
    late = rate_per_s * slow_s
    p_slow = 1 - p_fast
    cancel_charge = rate_per_s * (wait_s + cancel_stop_s)
    fast = p_fast * rate_per_s * fast_s
    uncovered_mean, uncovered_worst = jobs * p_slow * late, jobs * liability
    return TimedOutJobs(
        liability=liability,
        defective_uncovered_mean=uncovered_mean,
        defective_uncovered_worst=uncovered_worst,
        uncovered_mean_share=uncovered_mean / allowance,
        uncovered_worst_share=uncovered_worst / allowance,
        held_beyond_charge=liability - late,
        cancel_charge=cancel_charge,
        cancel_released=liability - cancel_charge,
        cost_cancel=jobs * (fast + p_slow * cancel_charge),
        cost_let_run=jobs * (fast + p_slow * late),
    )
