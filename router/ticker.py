"""Time for the trajectories no event wakes: the router delivers the kernel's ``Tick``.

:class:`Ticker`, run at the router's tick, lists the waiting trajectories (PAUSED,
AWAITING_APPROVAL, WAITING_TOOL) of every tenant every ``every_s`` seconds and delivers ``Tick``
to a rotating window of at most ``batch`` of them through :meth:`router.submit.RouterApi.deliver`,
so wall-clock limits, approval expiry and tool deadlines take effect. A tick that changes nothing
writes nothing; two routers ticking at once change a record once.
Design: ``docs/adr/0010-ticks-for-waiting-trajectories.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kernel.errors import ReinsError
from kernel.events import Tick
from kernel.states import LifecycleState
from router.submit import RouterApi

log = logging.getLogger("reins.router.ticker")
#: The states in which only time (or an outside event) moves a trajectory on.
WAITING = (
    LifecycleState.PAUSED,
    LifecycleState.AWAITING_APPROVAL,
    LifecycleState.WAITING_TOOL,
)


@dataclass
class Ticker:
    """Delivers ``Tick`` to waiting trajectories (see the module docstring)."""

    api: RouterApi
    tenants: tuple[str, ...]
    every_s: float
    clock: Callable[[], float]  # the clock the records' times are on (the fleet's wall clock)
    batch: int = 200
    ticked: int = 0  # ticks that changed a record, since start
    _next_at: float = float("-inf")
    _cursor: int = 0

    def tick(self) -> list[str]:
        """One visit, when it is due; returns the trajectories a tick changed."""
        now = self.clock()
        if now < self._next_at:
            return []
        self._next_at = now + self.every_s
        waiting = [
            (tenant, tid)
            for tenant in self.tenants
            for state in WAITING
            for tid in self.api.store.list(tenant, state)
        ]
        if not waiting:
            return []
        start = self._cursor % len(waiting)
        window = (waiting[start:] + waiting[:start])[: self.batch]
        self._cursor = start + len(window)
        changed = []
        for tenant, tid in window:
            try:
                result = self.api.deliver(tenant, tid, Tick(now=now))
            except ReinsError as exc:  # gone, or refused: the next visit looks again
                log.info("tick of %s/%s: %s", tenant, tid, exc)
                continue
            if result.commands or result.rows:  # a step that changed nothing has neither
                changed.append(tid)
        self.ticked += len(changed)
        if changed:
            log.info("ticks changed %d waiting trajectories: %s", len(changed), changed[:10])
        return changed
