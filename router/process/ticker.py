"""Time for the trajectories no event wakes: the router delivers the kernel's ``Tick``.

:class:`Ticker`, run at the router's tick, delivers ``Tick`` every ``every_s`` seconds to the next
``batch`` trajectories that wait between turns (READY, PAUSED, AWAITING_APPROVAL, WAITING_TOOL)
or for their closing call (FINALIZING),
walking the store's index of those states a page at a time
(:class:`router.process.sweeps.IndexCursor`), through
:meth:`router.process.submit.RouterApi.deliver`, so
wall-clock limits, approval expiry and tool deadlines take effect. A tick that changes nothing
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
from router.process.submit import RouterApi
from router.process.sweeps import IndexCursor

log = logging.getLogger("reins.router.ticker")
#: The states in which a trajectory waits between turns: time (or an outside event) moves it on,
#: and a READY one past its wall-clock limit must end even while no admission comes; and
#: FINALIZING, whose closing call has a time allowance of its own (kernel.finalizing).
WAITING = (
    LifecycleState.READY,
    LifecycleState.PAUSED,
    LifecycleState.AWAITING_APPROVAL,
    LifecycleState.WAITING_TOOL,
    LifecycleState.FINALIZING,
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
    _cursor: IndexCursor | None = None

    def tick(self) -> list[str]:
        """One visit, when it is due; returns the trajectories a tick changed."""
        now = self.clock()
        if now < self._next_at:
            return []
        self._next_at = now + self.every_s
        if self._cursor is None:
            self._cursor = IndexCursor(self.api.store, self.tenants, WAITING)
        window = self._cursor.take(self.batch)
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
