"""Retention: a finished trajectory is deleted once its tenant's retention has passed.

A trajectory is *due* when it ended (COMPLETED, FAILED, CANCELED), owes nothing
(:func:`store.base.retirable`) and its chain's last row (when it last moved; its submission
when the chain is empty) is older than its tenant's retention (``retention_days`` in the fleet's
configuration, else ``REINS_RETENTION_DAYS``). :class:`RetentionSweep`, run at each router tick,
walks the ended states' part of every tenant's index a bounded page at a time and retires what
is due by compare-and-delete at the version it read (:meth:`TrajectoryStore.retire`): a commit
that lands meanwhile wins, and the next walk looks again. :func:`due` is the one test, shared
with ``reins archive``. Design: ``docs/adr/0185-retention.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kernel.errors import ReinsError, SnapshotNotFound
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from router.admission.tenants import AdmissionConfig
from store.base import Retirement, TrajectoryKey, TrajectoryStore, retirable

log = logging.getLogger("reins.router.retention")
DAY_S = 86400.0
#: The ended states, walked in this order.
ENDED = (LifecycleState.COMPLETED, LifecycleState.FAILED, LifecycleState.CANCELED)
Key = TrajectoryKey


def retention_s(config: AdmissionConfig, tenant: str, default_days: float) -> float:
    """How long ``tenant``'s finished trajectories are kept, in seconds (a tenant no longer
    configured keeps the default)."""
    found = config.tenant(tenant)
    days = found.retention_days if found is not None else None
    return (days if days is not None else default_days) * DAY_S


def due(
    store: TrajectoryStore, tenant: str, trajectory_id: str, now: float, keep_s: float
) -> TrajectoryRecord | None:
    """The record of a trajectory due for retirement at ``now``, or None.

    Reads the chain's last row first (a short read) and loads the record only when that row is
    older than ``keep_s``. Errors of the store propagate: :class:`SnapshotNotFound` for an
    index entry whose trajectory is gone (a retire cut off half way).
    """
    last = store.last_row(tenant, trajectory_id)
    if last is not None and now - last.at < keep_s:
        return None
    record = store.load(tenant, trajectory_id)
    if not retirable(record):
        return None
    if record.chain_length != (0 if last is None else last.index + 1):
        return None  # it moved between the two reads: the next walk looks again
    moved_at = record.submitted_at if last is None else last.at
    return record if now - moved_at >= keep_s else None


@dataclass
class RetentionSweep:
    """Retires what is due, a bounded page of the ended states' index per pass.

    The cursor is the last id read in one (tenant, state) range, so a page costs the same
    wherever it starts and a backlog is walked once, what is retired behind it or not. Its bound: a
    trajectory is retired within its retention plus one walk of the ended index
    (``ceil(ended / budget)`` passes, one every ``every_s``).
    """

    store: TrajectoryStore
    tenants: tuple[str, ...]
    keep_s: Callable[[str], float]  # a tenant's retention, in seconds
    clock: Callable[[], float]  # the clock the chain rows' times are on (the fleet's wall clock)
    every_s: float = 10.0
    budget: int = 256  # index entries read per pass
    retired: int = 0  # since start
    laps: int = 0  # walks completed
    _slot: int = 0
    _after: str = ""
    _next_at: float = float("-inf")

    def sweep(self) -> list[Key]:
        """One pass, when it is due; returns the trajectories retired. A failed page read
        raises (the router logs its tick); a failure on one trajectory is logged and skipped."""
        now = self.clock()
        if now < self._next_at:
            return []
        self._next_at = now + self.every_s
        pairs = [(t, s) for t in self.tenants for s in ENDED]
        out: list[Key] = []
        read = visited = 0
        while pairs and read < self.budget and visited < len(pairs):
            tenant, state = pairs[self._slot % len(pairs)]
            limit = min(128, self.budget - read)
            ids = self.store.page(tenant, state, self._after, limit)
            read += len(ids)
            for tid in ids:
                if self._retire(tenant, tid, now) is Retirement.RETIRED:
                    out.append(TrajectoryKey(tenant, tid))
            if len(ids) < limit:  # this range is done: the next one from its start
                self._slot, self._after = (self._slot + 1) % len(pairs), ""
                self.laps += self._slot == 0
                visited += 1
            else:
                self._after = ids[-1]
        self.retired += len(out)
        if out:
            log.info("retired %d finished trajectories: %s", len(out), out[:10])
        return out

    def _retire(self, tenant: str, trajectory_id: str, now: float) -> Retirement:
        """Retire one trajectory if it is due; what became of it (``KEPT``: not due)."""
        try:
            try:
                record = due(self.store, tenant, trajectory_id, now, self.keep_s(tenant))
            except SnapshotNotFound:  # a retire cut off half way: this one drops the entry
                return self.store.retire(tenant, trajectory_id, 0)
            if record is None:
                return Retirement.KEPT
            return self.store.retire(tenant, trajectory_id, record.record_version)
        except ReinsError as exc:  # corrupt, or Redis: the next walk looks again
            log.info("retention of %s/%s: %s", tenant, trajectory_id, exc)
            return Retirement.KEPT
