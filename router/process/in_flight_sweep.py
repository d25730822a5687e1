"""The drift sweep of the tenants' turns in flight: an entry whose turn is over leaves.

Every path that ends a turn ends its entry in the shared admitter's turns in flight
(:mod:`router.admission.redis.in_flight`), but some ends leave no trace a router can act on: a
notice lost with its worker, a duplicate message's notice (which carries no claim, so it may end
nothing), a lapsed claim reaped while its trajectory was not READY. So a router reads, at most every
``every_s``, a page of up to ``budget`` in-flight entries whose claim is no longer pending, lane
after lane. An entry read under the same claim in an earlier pass (so older than ``every_s``: most
turns have ended by then, and cost nothing) has its record loaded, and it is ended, guarded by that
claim, when its trajectory is not acting or is gone: a trajectory admitted again meanwhile keeps its
new entry. A stale entry leaves within two walks of every lane's entries, a walk being about
(entries / ``budget`` + lanes) passes. Design: ``docs/adr/0123-tenant-caps.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.errors import ReinsError, SnapshotNotFound
from kernel.states import ACTING
from router.admission.claims import EndedTurn
from router.admission.redis.admitter import RedisAdmitter
from store.base import TrajectoryStore

log = logging.getLogger("reins.router.in_flight")


@dataclass
class InFlightSweep:
    """Walks the shared admitter's turns in flight a page per pass (module docstring)."""

    admitter: Callable[[], RedisAdmitter]  # the shared admitter in force
    store: TrajectoryStore
    every_s: float = 3.0
    clock: Callable[[], float] = time.monotonic
    budget: int = 256
    ended: int = 0
    _lane: int = 0
    _cursor: int = 0
    _lap: int = 0  # walks done over every lane
    _last: float = float("-inf")
    _seen: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)

    def sweep(self) -> int:
        """One pass if ``every_s`` passed since the last; returns how many entries it ended."""
        now = self.clock()
        if now - self._last < self.every_s:
            return 0
        self._last = now
        admitter = self.admitter()
        over = [
            turn for turn in self._page(admitter) if self._over(turn.tenant, turn.trajectory_id)
        ]
        if not over:
            return 0
        ended = int(admitter.release_many(over))
        self.ended += ended
        if ended:
            log.info("ended %d turns in flight whose trajectory acts no more", ended)
        return ended

    def _page(self, admitter: RedisAdmitter) -> list[EndedTurn]:
        """This pass's entries, lane after lane; those seen before under the same claim."""
        tenants: list[str] = admitter.lanes()
        seen, again = 0, []
        for _ in range(len(tenants)):
            lane = self._lane % len(tenants)
            cursor, entries = admitter.in_flight_page(lane, self._cursor, self.budget - seen)
            seen += len(entries)
            for tid, claim in entries:
                key = (tenants[lane], tid)
                if self._seen.get(key, ("", 0))[0] == claim:
                    again.append(EndedTurn(*key, claim))
                self._seen[key] = (claim, self._lap)
            self._cursor = cursor
            if cursor == 0:
                self._next_lane(lane, len(tenants))
            if seen >= self.budget or cursor != 0:
                break
        return again

    def _next_lane(self, lane: int, lanes: int) -> None:
        self._lane = lane + 1
        if self._lane % lanes == 0:  # a walk is done: forget what two walks did not see
            self._lap += 1
            self._seen = {k: v for k, v in self._seen.items() if v[1] >= self._lap - 1}

    def _over(self, tenant: str, trajectory_id: str) -> bool:
        """True when the trajectory is not acting (or gone); False while unsure."""
        try:
            return self.store.load(tenant, trajectory_id).state not in ACTING
        except SnapshotNotFound:
            return True
        except ReinsError as exc:  # Redis or a record this build cannot read: look again later
            log.info("in-flight check of %s/%s: %s", tenant, trajectory_id, exc)
            return False
