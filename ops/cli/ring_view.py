"""What ``reins ring show`` says about each member: pure functions over data already read.

A member is shown in one of four states, so an operator can follow a drain or a crash:

* ``active``: registered, heartbeating, takes new turns;
* ``draining``: registered, heartbeating, takes no new turns once every live router replica
  acknowledged the drain (``drain_acknowledged``; ``drain_pending`` names the replicas still
  placing new turns on it);
* ``dead``: still registered but its heartbeat lapsed, or it is stalled (its queue has work its
  consumer does not take), so it is out of every ring and the reconciler recovers the turns in
  its custody;
* ``gone``: no longer registered, yet it still has turns in custody or turns were recovered from
  it (a SIGKILLed worker that was then removed, or an earlier incarnation of a restarted one).

Beside the state, each row counts the turns in the member's custody now, the turns recovered from it
so far, and the worst time from its last heartbeat to one of those recoveries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from router.placement.membership import DrainStatus, MemberRecord
from router.placement.ring import Ring, points_for


class ShownState(StrEnum):
    """The state ``reins ring show`` gives a member (see the module docstring)."""

    ACTIVE = "active"
    DRAINING = "draining"
    DEAD = "dead"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Recovery:
    """One turn the reconciler recovered: from which member, how long after its heartbeat."""

    member: str
    since_heartbeat_s: float | None  # None when the member had no heartbeat left to measure from

    @classmethod
    def parse(cls, entry: object) -> Recovery:
        """Read one entry of the recoveries list; ValueError if it is not one."""
        if not isinstance(entry, dict) or not isinstance(entry.get("member"), str):
            raise ValueError(f"not a recovery entry: {entry!r}")
        since = entry.get("since_heartbeat_s")
        if since is not None and (isinstance(since, bool) or not isinstance(since, int | float)):
            raise ValueError(f"since_heartbeat_s is not a number: {entry!r}")
        return cls(entry["member"], None if since is None else float(since))


@dataclass(frozen=True, slots=True)
class MemberRow:
    """One member as shown: ring placement, state, and what it holds and lost."""

    name: str
    weight: float | None  # None once the member is no longer registered
    state: ShownState
    points: int
    share: float
    registered: bool
    live: bool
    draining: bool
    heartbeat_age_s: float | None
    drain_acknowledged: bool | None  # None unless draining
    drain_pending: tuple[str, ...]
    in_custody: int
    recovered: int
    worst_recovery_s: float | None
    stalled: bool = False  # heartbeating, but its queue has work its consumer does not take

    def as_json(self) -> dict[str, Any]:
        """The row as ``--json`` prints it; keys are only ever added."""
        age = self.heartbeat_age_s
        worst = self.worst_recovery_s
        return {
            "name": self.name,
            "weight": self.weight,
            "state": self.state.value,
            "points": self.points,
            "share": self.share,
            "registered": self.registered,
            "live": self.live,
            "draining": self.draining,
            "heartbeat_age_s": None if age is None else round(age, 3),
            "drain_acknowledged": self.drain_acknowledged,
            "drain_pending": list(self.drain_pending),
            "in_custody": self.in_custody,
            "recovered": self.recovered,
            "worst_recovery_s": None if worst is None else round(worst, 3),
            "stalled": self.stalled,
        }

    def describe(self) -> str:
        """The state with what an operator needs to read it, for the table."""
        if self.state is ShownState.DRAINING:
            if self.drain_acknowledged:
                return "draining (acknowledged)"
            if self.drain_pending:
                return f"draining (waiting on {', '.join(self.drain_pending)})"
            return "draining" if self.drain_acknowledged is None else "draining (no live replica)"
        if self.state is ShownState.DEAD:
            lapsed = (
                "stalled: its queue has work it does not take"
                if self.stalled
                else "no heartbeat"
                if self.heartbeat_age_s is None
                else f"lapsed {self.heartbeat_age_s:.0f}s ago"
            )
            return f"dead ({lapsed}{', was draining' if self.draining else ''})"
        if self.state is ShownState.GONE:
            parts = [f"recovered {self.recovered}"] if self.recovered else []
            if self.in_custody:
                parts.append(f"{self.in_custody} not yet recovered")
            return f"gone ({', '.join(parts)})"
        return self.state.value


def member_rows(
    records: Sequence[MemberRecord],
    ring: Ring,
    drains: Mapping[str, DrainStatus],
    in_custody: Mapping[str, int],
    recoveries: Sequence[Recovery],
    now: float,
) -> list[MemberRow]:
    """Every registered member by name, then every deregistered one still with turns in custody or
    with turns recovered from it, by name.

    ``ring`` is the ring built from ``records``; ``drains`` has the drain status of draining
    members (one missing is shown without it); ``in_custody`` counts each custodian's turns;
    ``now`` is on the clock the heartbeats were written with.
    """
    recovered: dict[str, int] = {}
    worst: dict[str, float] = {}
    for r in recoveries:
        recovered[r.member] = recovered.get(r.member, 0) + 1
        if r.since_heartbeat_s is not None:
            worst[r.member] = max(worst.get(r.member, r.since_heartbeat_s), r.since_heartbeat_s)
    shares = ring.shares()
    rows = []
    for record in records:
        in_ring = record.name in ring
        if not record.live:
            state = ShownState.DEAD
        else:
            state = ShownState.DRAINING if record.draining else ShownState.ACTIVE
        drain = drains.get(record.name) if record.draining else None
        age = now - record.heartbeat_at
        rows.append(
            MemberRow(
                name=record.name,
                weight=record.weight,
                state=state,
                points=points_for(record.weight, ring.points_per_weight) if in_ring else 0,
                share=shares.get(record.name, 0.0),
                registered=True,
                live=record.live,
                draining=record.draining,
                heartbeat_age_s=age if math.isfinite(age) else None,
                drain_acknowledged=None if drain is None else drain.acknowledged,
                drain_pending=() if drain is None else drain.pending,
                in_custody=in_custody.get(record.name, 0),
                recovered=recovered.get(record.name, 0),
                worst_recovery_s=worst.get(record.name),
                stalled=record.stalled,
            )
        )
    registered = {r.name for r in records}
    gone = {m for m, n in in_custody.items() if n > 0} | set(recovered)
    for name in sorted(gone - registered):
        rows.append(
            MemberRow(
                name=name,
                weight=None,
                state=ShownState.GONE,
                points=0,
                share=0.0,
                registered=False,
                live=False,
                draining=False,
                heartbeat_age_s=None,
                drain_acknowledged=None,
                drain_pending=(),
                in_custody=in_custody.get(name, 0),
                recovered=recovered.get(name, 0),
                worst_recovery_s=worst.get(name),
            )
        )
    return rows
