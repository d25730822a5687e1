"""Stranded turns: a trajectory left mid-turn with no worker carrying it on, recovered.

:class:`StrandedTurns` is the router's slow backstop, run by the reconciler after its own pass
(:mod:`router.reconcile`), for turns no custody entry names. Each sweep lists the acting
trajectories of every tenant, remembers when it first saw each at which version, and delivers
``Recover`` to those still at that version after ``after_s`` (longer than the longest turn), by
compare-and-set on that version: a slow turn that moved on is left alone, and two routers recover a
turn once. Design: ``docs/adr/0008-turn-recovery.md``.
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
