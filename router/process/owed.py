"""The reconciler's other duty: what ended runs still owe, settled on a bounded schedule.

A run that ends with an operation open hands it to the reconciler (``kernel.owed``); the store
lists such runs, atomically with the commit that ended them (``TrajectoryStore.owing``).
:class:`OwedRuns`, at each router tick, delivers ``Reconcile`` to each one it has seen owing
for ``after_s`` (time for late evidence to settle it the ordinary way), and again every
``after_s`` while it still owes. The kernel answers with lookups, which go to a worker like any
tool call (the worker checks each names an owed call of an ended run), or writes off what
cannot be asked. Its bound: after at most ``kernel.owed.MAX_LOOKUPS`` + 1 passes, so about
``(MAX_LOOKUPS + 2) * after_s`` after the end, nothing is owed. Two routers may both pass over
a run; the record's compare-and-set orders them, and a lookup twice is harmless (it is a read,
fenced). Design: docs/adr/0104-owed-settlements.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.errors import ReinsError
from kernel.events import Reconcile
from router.fleet.observe import RouterObserver
from router.process.submit import RouterApi
from store.base import TrajectoryKey

log = logging.getLogger("reins.router.owed")
Key = TrajectoryKey
LISTED = 1000  # owing runs read per tenant and tick: counted for the gauge, the first due served


@dataclass
class OwedRuns:
    """Delivers ``Reconcile`` to ended runs that still owe (see the module docstring)."""

    api: RouterApi
    tenants: tuple[str, ...]
    after_s: float
    clock: Callable[[], float]
    budget: int = 64  # runs reconciled per tick, over all tenants
    observer: RouterObserver = field(default_factory=RouterObserver)
    reconciled: int = 0  # passes delivered since start
    _due: dict[Key, float] = field(default_factory=dict)  # next pass of each owing run

    def sweep(self) -> list[str]:
        """One pass over what is due; returns the trajectories reconciled."""
        now, out = self.clock(), list[str]()
        seen: set[Key] = set()
        counts: dict[str, int] = {}
        for tenant in self.tenants:
            try:
                owing = self.api.store.owing(tenant, LISTED)
            except ReinsError as exc:  # Redis away: the next tick looks again
                log.info("owed runs of %s: %s", tenant, exc)
                continue
            counts[tenant] = len(owing)
            for tid in owing:
                key = TrajectoryKey(tenant, tid)
                seen.add(key)
                due = self._due.setdefault(key, now + self.after_s)
                if now < due or len(out) >= self.budget:
                    continue
                self._due[key] = now + self.after_s
                if self._reconcile(key, now):
                    out.append(tid)
        for key in [k for k in self._due if k not in seen]:
            del self._due[key]  # settled (or past this page): seen afresh if listed again
        self.reconciled += len(out)
        self.observer.on_owed_runs(counts)
        if out:
            log.info("reconciled %d ended runs that still owed: %s", len(out), out[:10])
        return out

    def _reconcile(self, key: Key, now: float) -> bool:
        try:
            # The event's time is the fleet's wall clock, as every other event's: ``now`` is
            # this sweep's own schedule (monotonic), and a record must never carry it.
            self.api.deliver(*key, Reconcile(now=self.api.clock()))
        except ReinsError as exc:  # refused, gone, or Redis: the next pass tries again
            log.warning("reconciling %s/%s: %s", key[0], key[1], exc)
            return False
        return True
