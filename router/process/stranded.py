"""Stranded turns: a trajectory left mid-turn with no worker carrying it on, recovered.

:class:`StrandedTurns` is the router's backstop, run by the reconciler after its own pass
(:mod:`router.process.reconcile`). It walks the acting trajectories (and those in FINALIZING,
whose closing call may be in flight) of every tenant a page per tick
(:class:`router.process.sweeps.IndexCursor`) and delivers ``Recover`` by compare-and-set to one
whose version has stood still for ``after_s`` while no member's custody names it in its current
turn: a router or worker died between the admission's compare-and-set and its custody entry, or a
worker gave the turn up after its commits failed. Such a turn is recovered within ``2 * after_s``
plus one walk of the acting index. A turn a member still has in custody is left to it while its
version moves (every step commits one, and no call outlasts ``REINS_MAX_TURN_S``): once it stood
still for ``held_after_s`` since the member's queue was last seen with work in it, its message was
lost on the way (a broker connection cut mid-delivery) and it is recovered; while the queue has
work, the message may still wait there, and only ``slow_after_s`` (twice the visibility timeout)
recovers it. Two routers
recover a turn once. Design: ``docs/adr/0008-turn-recovery.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.errors import ReinsError
from kernel.record import TrajectoryRecord
from kernel.states import ACTING, LifecycleState
from router.process.submit import RouterApi
from router.process.sweeps import IndexCursor, Key
from router.wire.custody import Custody

log = logging.getLogger("reins.router.stranded")
#: Where a turn can be stranded: an acting state, or FINALIZING while its closing call runs.
SWEPT = frozenset({*ACTING, LifecycleState.FINALIZING})
_ACTING = tuple(sorted(SWEPT, key=lambda s: s.value))


@dataclass
class _Watch:
    since: float  # when this version was first seen
    version: int | None  # None until the record was first read
    check_at: float  # when to read it again
    lap: int = 0  # the cursor's walk it was last seen in
    busy_at: float = 0.0  # when a holder's queue was last seen with work in it


@dataclass
class StrandedTurns:
    """Finds and recovers stranded turns (see the module docstring)."""

    api: RouterApi
    cursor: IndexCursor
    custody: Custody | None
    after_s: float
    slow_after_s: float
    clock: Callable[[], float]
    held_after_s: float = float("inf")
    queued: Callable[[str], int | None] = lambda member: None  # a member's queue depth
    budget: int = 256
    recovered: int = 0
    _watch: dict[Key, _Watch] = field(default_factory=dict)

    @classmethod
    def over(
        cls,
        api: RouterApi,
        tenants: tuple[str, ...],
        *,
        custody: Custody | None,
        after_s: float,
        slow_after_s: float,
        clock: Callable[[], float],
        held_after_s: float = float("inf"),
        queued: Callable[[str], int | None] = lambda member: None,
    ) -> StrandedTurns:
        """The backstop over the acting trajectories of ``tenants`` in ``api``'s store."""
        cursor = IndexCursor(api.store, tenants, _ACTING)
        return cls(api, cursor, custody, after_s, slow_after_s, clock, held_after_s, queued)

    def sweep(self) -> list[str]:
        """One page of the walk; returns the trajectories recovered."""
        now, lap = self.clock(), self.cursor.laps
        out = []
        for key in self.cursor.take(self.budget):
            watch = self._watch.get(key)
            if watch is None:
                self._watch[key] = _Watch(now, None, now + self.after_s, lap)
                continue
            watch.lap = lap
            if now >= watch.check_at and self._check(key, watch, now):
                out.append(key[1])
                self._watch.pop(key, None)
        gone = [k for k, w in self._watch.items() if w.lap < self.cursor.laps - 1]
        for key in gone:  # a whole walk did not see it: it is acting no more
            del self._watch[key]
        self.recovered += len(out)
        if out:
            log.warning("recovered %d stranded turns: %s", len(out), out[:10])
        return out

    def _check(self, key: Key, watch: _Watch, now: float) -> bool:
        """Read the record; True when it was stranded and is now recovered."""
        try:
            rec = self.api.store.load(*key)
            if rec.state not in SWEPT:
                del self._watch[key]
                return False
            if rec.record_version != watch.version:  # moved on (or first read): watch again
                watch.since, watch.version, watch.check_at = now, rec.record_version, now
                watch.check_at += self.after_s
                return False
            if not self._stood_still(rec, watch, now):
                watch.check_at = now + self.after_s
                return False
            return self.api.recover(rec)
        except ReinsError as exc:  # gone, refused, or Redis: the next walk looks again
            log.info("stranded check of %s/%s: %s", key[0], key[1], exc)
            watch.check_at = now + self.after_s
            return False

    def _stood_still(self, rec: TrajectoryRecord, watch: _Watch, now: float) -> bool:
        """True when ``rec``'s version has stood still for longer than its turn may take.

        While a holder's queue has work, the turn's message may wait there: only ``slow_after_s``
        counts it stranded. Once the queue empties, the turn began at the earliest when the
        queue was last seen busy, so ``held_after_s`` is counted from then, not from when the
        version was first seen (a turn that waited behind others is not taken for lost the
        moment it starts).
        """
        holders = self._holders(rec)
        if not holders:
            return now - watch.since >= self.after_s
        if any(self.queued(member) != 0 for member in holders):
            watch.busy_at = now
            return now - watch.since >= self.slow_after_s
        began = max(watch.since, watch.busy_at)
        return now - began >= max(self.held_after_s, self.after_s)

    def _holders(self, rec: TrajectoryRecord) -> list[str]:
        """The members whose custody names ``rec``'s current turn (none without custody)."""
        if self.custody is None:
            return []
        return [
            member
            for member, entry in self.custody.naming(rec.tenant, rec.trajectory_id)
            if entry.in_turn(rec)
        ]
