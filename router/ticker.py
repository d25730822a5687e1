"""Time for the trajectories no event wakes: the router delivers the kernel's ``Tick``.

A trajectory that waits (PAUSED, AWAITING_APPROVAL, or WAITING_TOOL on a long job) changes only
when an event reaches it, and the passing of time is not an event unless something delivers
it. The kernel's ``Tick`` (``kernel.control.on_tick``) ends a run past its wall-clock limit,
expires an approval past its time to live, and acts on a tool wait's deadline. Turns in flight
need no tick: every event a worker delivers carries the time.

:class:`Ticker`, run at the router's tick, lists the waiting trajectories of every tenant from
the state index every ``every_s`` seconds and delivers ``Tick`` to a window of at most
``batch`` of them (the window rotates, so a long list is covered in turn). Delivery goes
through :meth:`router.submit.RouterApi.deliver`: a load, the kernel's step, and a
compare-and-set only when the step changed the record, so a tick with nothing due writes
nothing, two routers ticking at once change a record once, and what the step asks for (a
stop's notice, a dispatch) is carried out as for any event.

The cost is one load per waiting trajectory per visit; a deadline index kept by the store
would make it one read per tick, and is the next step if fleets hold many thousands waiting.
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
