"""The drift sweep of the tenants' turns in flight: an entry whose turn is over leaves.

Every path that ends a turn ends its entry in the shared admitter's turns in flight
(:mod:`router.redis_inflight`), but some ends leave no trace a router can act on: a notice
lost with its worker, a duplicate message's notice (which carries no claim, so it may end
nothing), a lapsed claim reaped while its trajectory was not READY. So each router tick
reads a page of the in-flight entries whose claim is no longer pending, loads their records,
and ends every entry whose trajectory is not acting (or is gone), guarded by the claim the
entry names: a trajectory admitted again meanwhile keeps its new entry. Over ``budget``
entries a tick, lane after lane, a stale entry leaves within one walk of every lane's entries.
Design: ``docs/adr/0123-tenant-caps.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.errors import ReinsError, SnapshotNotFound
from kernel.states import ACTING
from store.base import TrajectoryStore

log = logging.getLogger("reins.router.inflight")


@dataclass
class InFlightSweep:
    """Walks the shared admitter's turns in flight a page per tick (module docstring)."""

    admitter: Callable[[], Any]  # the shared admitter in force (RedisAdmitter)
    store: TrajectoryStore
    budget: int = 256
    ended: int = 0
    _lane: int = 0
    _cursor: int = 0

    def sweep(self) -> int:
        """One tick's pages; returns how many stale entries it ended."""
        admitter = self.admitter()
        tenants: list[str] = admitter.lanes()
        seen, stale = 0, []
        for _ in range(len(tenants)):
            lane = self._lane % len(tenants)
            cursor, entries = admitter.in_flight_page(lane, self._cursor, self.budget - seen)
            seen += len(entries)
            stale += [(tenants[lane], tid, claim) for tid, claim in entries]
            self._cursor = cursor
            if cursor == 0:
                self._lane = lane + 1
            if seen >= self.budget or cursor != 0:
                break
        over = [turn for turn in stale if self._over(*turn[:2])]
        if not over:
            return 0
        ended = admitter.release_many(over)
        self.ended += ended
        if ended:
            log.info("ended %d turns in flight whose trajectory acts no more", ended)
        return int(ended)

    def _over(self, tenant: str, trajectory_id: str) -> bool:
        """True when the trajectory is not acting (or gone); False while unsure."""
        try:
            return self.store.load(tenant, trajectory_id).state not in ACTING
        except SnapshotNotFound:
            return True
        except ReinsError as exc:  # Redis or a record this build cannot read: look again later
            log.info("in-flight check of %s/%s: %s", tenant, trajectory_id, exc)
            return False
