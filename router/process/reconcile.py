"""Crash recovery: the turns in the custody of a lapsed member, recovered from the store.

:class:`Reconciler`, at each router tick: for every lapsed custodian already out of the ring,
take each of its custody entries (:mod:`router.wire.custody`; only one router wins each) and deliver
``Recover`` by compare-and-set while the record is still in the sent turn. Design:
``docs/adr/0008-turn-recovery.md``. Then the stranded-turn backstop (:mod:`router.process.stranded`)
and what ended runs still owe (:mod:`router.process.owed`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.errors import ReinsError
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from router.placement.membership import MemberRecord, Membership
from router.placement.ring import Ring
from router.process.owed import OwedRuns
from router.process.stranded import StrandedTurns
from router.process.submit import RouterApi
from router.wire.custody import Custody, Entrusted

log = logging.getLogger("reins.router.reconcile")
RECOVERIES_CAP = 100_000


@dataclass
class Reconciler:
    """Recovers the turns of lapsed members (see the module docstring); one per router."""

    api: RouterApi
    membership: Membership
    custody: Custody
    ring: Callable[[], Ring]
    by: str
    backstop: StrandedTurns | None = None
    owed: OwedRuns | None = None  # what ended runs still owe (router.process.owed)
    recovered: int = 0
    figures: list[float] = field(default_factory=list)  # seconds from last heartbeat

    def tick(self) -> list[str]:
        """One pass over the lapsed custodians; returns the trajectories recovered."""
        out = self._lapsed()
        if self.backstop is not None:
            out += self.backstop.sweep()
        if self.owed is not None:
            self.owed.sweep()
        return out

    def _lapsed(self) -> list[str]:
        custodians = self.custody.custodians()
        if not custodians:
            return []
        records = {r.name: r for r in self.membership.records()}
        dead = self._dead(custodians, records)
        if not dead:
            return []
        entries: list[dict[str, Any]] = []
        for member in dead:
            entries += self._recover_member(member, records.get(member))
        self.custody.record_recoveries(entries)
        out = [e["trajectory_id"] for e in entries]
        self.recovered += len(out)
        if out:
            worst = max((e["since_heartbeat_s"] or 0.0) for e in entries)
            log.warning(
                "recovered %d turns of lapsed members %s (worst %.2fs after the last heartbeat)",
                len(out),
                dead,
                worst,
            )
        return out

    def _dead(self, custodians: set[str], records: dict[str, MemberRecord]) -> list[str]:
        """The custodians to recover from: lapsed (or gone) and already out of this router's ring,
        so a recovered turn is never placed on the dead member again; none while no member on
        the ring takes new work, since a recovery could not be sent on."""
        ring = self.ring()
        on_ring = {m.name for m in ring.members}
        dead = sorted(
            m for m in custodians if (m not in records or not records[m].live) and m not in on_ring
        )
        if not dead or not any(not m.draining for m in ring.members):
            return []
        return dead

    def _recover_member(self, member: str, rec: MemberRecord | None) -> list[dict[str, Any]]:
        """Take and recover each turn ``member`` holds; its recovery entries. A member that
        holds nothing and is no longer registered (``rec`` None) is forgotten."""
        held = self.custody.entrusted_to(member)
        if not held:
            if rec is None:
                self.custody.forget(member)
            return []
        last_beat = rec.heartbeat_at if rec is not None else -math.inf
        entries: list[dict[str, Any]] = []
        for h in held:
            if not self.custody.take(member, h):
                continue  # another router took it
            if not self._recover(h):
                continue
            since = self.custody.redis_now() - last_beat
            entries.append(
                {
                    "member": member,
                    "tenant": h.tenant,
                    "trajectory_id": h.trajectory_id,
                    "since_heartbeat_s": round(since, 3) if math.isfinite(since) else None,
                    "by": self.by,
                }
            )
            if math.isfinite(since):
                self.figures.append(since)
        return entries

    def _recover(self, h: Entrusted) -> bool:
        """``Recover`` by compare-and-set while the record is still in the sent turn."""
        try:
            rec = self.api.store.load(h.tenant, h.trajectory_id)
            if not self._stranded(rec, h):
                return False
            return self.api.recover(rec, lambda now: self._stranded(now, h), by=self.by)
        except ReinsError as exc:
            log.warning("recovery of %s/%s failed: %s", h.tenant, h.trajectory_id, exc)
            return False

    def _stranded(self, rec: TrajectoryRecord, h: Entrusted) -> bool:
        """True while ``rec`` is still in the turn ``h`` sent. A record found READY is queued
        again: the turn ended, but its notice may have died with the member (killed between
        the commit and the push); a duplicate queue entry is refused."""
        if rec.state is LifecycleState.READY:
            self.api.requeue(rec)
            return False
        return h.in_turn(rec)
