"""Gate leases of the turns a worker runs, kept alive while the turn lasts.

:class:`LeaseKeeper` is told when a turn starts and ends (:meth:`hold`, :meth:`drop`) and,
driven by the heartbeat thread (:meth:`renew_due`), renews each held lease every third of its
ttl. A renewal the gate refuses (the lease lapsed or was settled) is logged and the lease let
go. Why the worker renews a lease a router took: docs/adr/0043-gate-lease-renewal.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("reins.worker.leases")


class Renews(Protocol):
    """What the keeper needs of the gates: renew one lease (True if it was still live)."""

    def renew(self, route: str, lease_id: str) -> bool: ...


class LeaseKeeper:
    """Renews the gate leases of the turns in flight (see the module docstring)."""

    def __init__(self, gates: Renews, clock: Callable[[], float] = time.monotonic) -> None:
        self.gates, self.clock = gates, clock
        self._held: dict[str, tuple[str, float, float]] = {}  # lease -> route, ttl, renew at
        self._lock = threading.Lock()
        self.renewed = 0
        self.lost = 0

    def hold(self, route: str, lease: str, ttl_s: float) -> bool:
        """A turn under ``lease`` started; renew it every ``ttl_s / 3`` until dropped. False
        when a turn of this process holds it already (a duplicate message): only that turn
        may drop or settle it."""
        if lease and route and ttl_s > 0:
            with self._lock:
                if lease in self._held:
                    return False
                self._held[lease] = (route, ttl_s, self.clock() + ttl_s / 3)
        return True

    def drop(self, lease: str) -> None:
        """The turn under ``lease`` ended (or went to another member): stop renewing it."""
        with self._lock:
            self._held.pop(lease, None)

    def held(self) -> list[str]:
        """The leases being kept alive now."""
        with self._lock:
            return sorted(self._held)

    def renew_due(self) -> int:
        """Renew every lease whose time has come; returns how many were renewed."""
        now = self.clock()
        with self._lock:
            due = [(lease, r, ttl) for lease, (r, ttl, at) in self._held.items() if at <= now]
        renewed = 0
        for lease, route, ttl in due:
            try:
                live = self.gates.renew(route, lease)
            except Exception:  # Redis unreachable: the next beat tries again
                log.exception("could not renew gate lease %s on %s", lease, route)
                continue
            with self._lock:
                if lease not in self._held:
                    continue  # the turn ended meanwhile
                if live:
                    self._held[lease] = (route, ttl, now + ttl / 3)
                    renewed += 1
                else:
                    del self._held[lease]
                    self.lost += 1
                    log.warning("gate lease %s on %s had lapsed; not renewed", lease, route)
        self.renewed += renewed
        return renewed
