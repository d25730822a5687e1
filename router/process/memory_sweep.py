"""Memory expiry: facts and episodes past their expiry or their tenant's retention, deleted.

An item is *due* once its own expiry has passed (a fact's ``ttl_days``) or it was written longer
ago than its tenant's memory retention (the fleet document's ``[memory]`` section,
:mod:`router.fleet.memory_config`; else ``REINS_MEMORY_RETENTION_DAYS``). Recall never returns
an expired item; this sweep deletes it, with every index entry, from the store. Each router runs
:class:`MemorySweep` at its tick, at most every ``every_s``, deleting at most ``budget`` items a
pass: it stays on a tenant while the store says more is due there, then moves on, so a backlog
drains at ``budget`` items a pass and no tenant waits behind another's for more than one lap.
Every router sweeps; two deleting the same item is harmless (the second finds nothing), and an
item written again meanwhile is kept (:meth:`store.memory_base.MemoryBank.sweep`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kernel.errors import ReinsError
from kernel.memory import ms
from router.fleet.config import ConfigSource
from router.fleet.memory_config import NO_MEMORY_SECTION
from store.memory_base import MemoryBank

log = logging.getLogger("reins.router.memory")

#: Items deleted at most per pass, and per call to the store within it.
SWEEP_BUDGET, SWEEP_PAGE = 256, 64


@dataclass
class MemorySweep:
    """Deletes what is due in each tenant's memory, a bounded amount per pass."""

    bank: MemoryBank
    tenants: Callable[[], Sequence[str]]  # the tenants to sweep (the configuration in force)
    keep_ms: Callable[[str], int]  # a tenant's retention
    clock: Callable[[], float]  # wall-clock seconds (the clock items' times are written on)
    every_s: float = 10.0
    budget: int = SWEEP_BUDGET
    deleted: int = 0  # since start
    _slot: int = 0
    _next_at: float = float("-inf")

    def sweep(self) -> int:
        """One pass, when it is due; how many items it deleted. A tenant whose store fails is
        logged and left for the next pass."""
        now = self.clock()
        if now < self._next_at:
            return 0
        self._next_at = now + self.every_s
        tenants = list(self.tenants())
        gone = visited = 0
        while tenants and gone < self.budget and visited < len(tenants):
            tenant = tenants[self._slot % len(tenants)]
            limit = min(SWEEP_PAGE, self.budget - gone)
            try:
                swept = self.bank.sweep(tenant, ms(now), self.keep_ms(tenant), limit)
            except ReinsError as exc:
                log.warning("memory sweep of %s: %s", tenant, exc)
                swept = None
            if swept is not None:
                gone += swept.deleted
            if swept is None or not swept.more or not swept.deleted:  # the next tenant
                self._slot = (self._slot + 1) % len(tenants)
                visited += 1
        self.deleted += gone
        if gone:
            log.info("deleted %d memory items past their expiry or retention", gone)
        return gone


def memory_keep_ms(source: ConfigSource | None, default_days: float, tenant: str) -> int:
    """``tenant``'s memory retention in ms, by the fleet document in force (``source``; None: a
    router run from files, which has no memory section), else ``default_days``."""
    fleet = source.peek() if source is not None else None
    section = fleet.memory if fleet is not None else NO_MEMORY_SECTION
    return section.keep_ms(tenant, default_days)


def sweep_once(bank: MemoryBank, tenant: str, keep_ms: int, now_s: float) -> int:
    """One bounded sweep of one tenant's memory (the embedded store's, after ``reins run``)."""
    return bank.sweep(tenant, ms(now_s), keep_ms, SWEEP_BUDGET).deleted
