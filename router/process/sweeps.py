"""Sweeps over the store's state index, a page per tick: nothing READY is left out of a queue.

:class:`IndexCursor` walks the trajectories of some states for every tenant, a bounded page at a
time (``TrajectoryStore.page``), and starts over when it has been round. :class:`ReadySweep`
requeues every READY trajectory that no admitter queue holds (nor any claim) once it has stayed
so for ``grace_s``: its notice was lost (a worker or router died with it, or a push failed). Its
bound: a READY trajectory missed by every notice is queued again within ``grace_s`` plus one walk
of the READY index (``ceil(ready / budget)`` ticks). Requeueing twice is harmless: the admitter
refuses a duplicate queue entry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.errors import ReinsError
from kernel.states import LifecycleState
from router.process.submit import RouterApi
from store.base import TrajectoryKey, TrajectoryStore

log = logging.getLogger("reins.router.sweeps")
Key = TrajectoryKey


@dataclass
class IndexCursor:
    """Pages through ``states`` of every tenant in turn; :meth:`take` costs bounded work.

    Each page continues after the last id of the one before (``TrajectoryStore.page``), so a
    walk returns every id that stays in its state all through it, however deep the index."""

    store: TrajectoryStore
    tenants: tuple[str, ...]
    states: tuple[LifecycleState, ...]
    page_size: int = 128
    laps: int = 0  # walks completed
    _slot: int = 0  # which (tenant, state) pair
    _after: str = ""  # the last id taken from that pair ("" before its first)

    def take(self, budget: int) -> list[Key]:
        """Up to ``budget`` trajectories, the next pages of the walk; once round, starts over
        (so one call never returns an id twice, and a small index is walked once per call)."""
        pairs = [(t, s) for t in self.tenants for s in self.states]
        out: list[Key] = []
        visited = 0
        while pairs and len(out) < budget and visited < len(pairs):
            tenant, state = pairs[self._slot % len(pairs)]
            limit = min(self.page_size, budget - len(out))
            ids = self.store.page(tenant, state, self._after, limit)
            out += [TrajectoryKey(tenant, tid) for tid in ids]
            if len(ids) < limit:  # this pair is done: the next one from its start
                self._slot, self._after = (self._slot + 1) % len(pairs), ""
                self.laps += self._slot == 0
                visited += 1
            else:
                self._after = ids[-1]
        return list(dict.fromkeys(out))


@dataclass
class ReadySweep:
    """Requeues READY trajectories that no queue holds (see the module docstring)."""

    api: RouterApi
    cursor: IndexCursor
    queued: Callable[[str], bool]  # the admitter's is_queued (queued, or claimed)
    grace_s: float
    clock: Callable[[], float]
    budget: int = 256
    requeued: int = 0
    _unqueued: dict[Key, tuple[float, int]] = field(default_factory=dict)  # since, lap seen

    def sweep(self) -> list[str]:
        """One page of the walk; returns the trajectories queued again."""
        now = self.clock()
        out = []
        lap = self.cursor.laps
        for key in self.cursor.take(self.budget):
            if self.queued(key[1]):
                self._unqueued.pop(key, None)
                continue
            since = self._unqueued.get(key, (now, lap))[0]
            self._unqueued[key] = (since, lap)
            if now - since >= self.grace_s and self._requeue(key):
                out.append(key[1])
                del self._unqueued[key]
        self._forget_unseen(before_lap=self.cursor.laps - 1)
        self.requeued += len(out)
        if out:
            log.warning("requeued %d READY trajectories no queue held: %s", len(out), out[:10])
        return out

    def _requeue(self, key: Key) -> bool:
        try:
            rec = self.api.store.load(*key)
            if rec.state is not LifecycleState.READY or self.queued(key[1]):
                return False
            self.api.requeue(rec)
        except ReinsError as exc:  # gone, refused, or Redis: the next walk looks again
            log.info("READY sweep of %s/%s: %s", key[0], key[1], exc)
            return False
        return True

    def _forget_unseen(self, before_lap: int) -> None:
        """Drop what a whole walk did not see again: it left READY."""
        stale = [k for k, (_, lap) in self._unqueued.items() if lap < before_lap]
        for key in stale:
            del self._unqueued[key]
