"""Stranded turns: a trajectory left mid-turn with no worker carrying it on, recovered.

A worker that dies mid-turn leaves its record in CALLING_MODEL or WAITING_TOOL. Usually its
Celery message comes back (late acknowledgement, restored after the visibility timeout, marked
redelivered) and the worker that takes it recovers the turn from the record (:mod:`worker.turn`).
But Celery can also lose a message outright (a worker killed between taking a message and
marking it unacknowledged), and then nothing would ever touch the record again.

:class:`StrandedTurns` is the router's slow backstop, run by the reconciler
(:mod:`router.reconcile`, which recovers a lapsed member's held turns within seconds) after
its own pass, for turns no holding names: each sweep lists the acting trajectories of every
tenant from the state index (cheap), remembers when it first saw each one at which version,
and delivers the kernel's ``Recover`` to those still at the same version after ``after_s``,
which must be longer than the longest turn (twice the visibility timeout by default).
Recovery is a compare-and-set on that very version, so a turn that was merely slow and moved
on meanwhile is left alone, two routers sweeping at once recover a turn once, and a late
message for a recovered turn is stale and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kernel.errors import ReinsError
from kernel.states import LifecycleState
from router.submit import RouterApi

log = logging.getLogger("reins.router.stranded")
ACTING = (LifecycleState.CALLING_MODEL, LifecycleState.WAITING_TOOL)


@dataclass
class StrandedTurns:
    """Finds and recovers stranded turns (see the module docstring)."""

    api: RouterApi
    tenants: tuple[str, ...]
    after_s: float
    clock: Callable[[], float]
    recovered: int = 0
    _seen: dict[tuple[str, str], tuple[float, int | None]] = field(default_factory=dict)

    def sweep(self) -> list[str]:
        """One pass; returns the trajectories recovered."""
        now = self.clock()
        acting = {
            (t, tid) for t in self.tenants for s in ACTING for tid in self.api.store.list(t, s)
        }
        for gone in set(self._seen) - acting:
            del self._seen[gone]
        out = []
        for key in acting:
            first, version = self._seen.setdefault(key, (now, None))
            if now - first < self.after_s:
                continue
            try:
                current = self.api.store.load(*key)
            except ReinsError:
                continue
            if current.state not in ACTING:
                del self._seen[key]
            elif version != current.record_version:
                self._seen[key] = (now, current.record_version)  # moved on: watch again
            elif self.api.recover(current):
                out.append(key[1])
                del self._seen[key]
        self.recovered += len(out)
        if out:
            log.warning("recovered %d stranded turns: %s", len(out), out[:10])
        return out
