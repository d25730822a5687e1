"""Local capacity gates for tools, each bottleneck in its own unit (slots, memory, disk ...).

One :class:`ToolCapacity` per worker host, in memory behind one lock. :meth:`ToolCapacity.fits`
(the kernel's ``KernelContext.capacity`` plug-in) only reads: an approved action that does not
fit now stays AWAITING_APPROVAL until a later delivery finds room. :class:`ToolQueue` admits
tool calls in arrival order; one that does not fit stays at the head until a settlement
returns enough units. Design: ``docs/adr/0012-tool-capacity.md``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from kernel.errors import ConfigError, InvalidInput
from kernel.record import TrajectoryRecord
from kernel.tools import ToolSpec

Units = Mapping[str, int]
#: What one call of a tool needs: fixed per tool, or computed from its arguments.
Demand = Units | Callable[[ToolSpec, dict[str, Any]], Units]


class ToolCapacity:
    """Units available on this host and what each tool takes of them; thread-safe.

    Invariant: for every unit, the units held by acquired keys never exceed the total.
    Tools not listed in ``demands`` need nothing and always fit.
    """

    def __init__(self, units: Units, demands: Mapping[str, Demand]) -> None:
        for name, total in units.items():
            if not isinstance(total, int) or total < 0:
                raise ConfigError(f"tool capacity: unit {name!r} must be an integer >= 0")
        self._total = dict(units)
        self._demands = dict(demands)
        self._held: dict[str, dict[str, int]] = {}
        self._used = dict.fromkeys(units, 0)
        self._lock = threading.Lock()

    def demand_of(self, spec: ToolSpec, args: dict[str, Any]) -> dict[str, int]:
        """The units one call of ``spec`` with ``args`` needs, checked against known units."""
        demand = self._demands.get(spec.name, {})
        units = dict(demand(spec, args) if callable(demand) else demand)
        for name, amount in units.items():
            if name not in self._total:
                raise InvalidInput(f"tool {spec.name} asks for unknown unit {name!r}")
            if not isinstance(amount, int) or amount < 0:
                raise InvalidInput(f"tool {spec.name}: {name} must be an integer >= 0")
        return units

    def fits(self, rec: TrajectoryRecord, spec: ToolSpec, args: dict[str, Any]) -> bool:
        """Whether the call fits in what is free now: ``KernelContext.capacity``. Reads only."""
        demand = self.demand_of(spec, args)
        with self._lock:
            return self._fits(demand)

    def acquire(self, key: str, demand: Units) -> bool:
        """Take ``demand`` for ``key`` all at once, or nothing; True if ``key`` holds it now.

        A key that already holds units is not charged again (a redelivered dispatch).
        """
        with self._lock:
            if key in self._held:
                return True
            if not self._fits(demand):
                return False
            self._held[key] = dict(demand)
            for name, amount in demand.items():
                self._used[name] += amount
            return True

    def release(self, key: str) -> bool:
        """Return ``key``'s units (its tool call settled); False if it held none."""
        with self._lock:
            demand = self._held.pop(key, None)
            if demand is None:
                return False
            for name, amount in demand.items():
                self._used[name] -= amount
            return True

    def free(self) -> dict[str, int]:
        """Units free now, per unit."""
        with self._lock:
            return {name: self._total[name] - self._used[name] for name in self._total}

    def can_ever_fit(self, demand: Units) -> bool:
        """Whether ``demand`` fits in the whole capacity (an empty host)."""
        return all(amount <= self._total.get(name, -1) for name, amount in demand.items())

    def _fits(self, demand: Units) -> bool:
        return all(
            self._used[name] + amount <= self._total[name] for name, amount in demand.items()
        )


class ToolQueue:
    """Tool dispatches waiting for capacity, admitted in arrival order (head of line).

    :meth:`offer` queues a call; :meth:`admit` takes units for calls from the head while the
    head fits and returns their keys, in order, to dispatch; :meth:`settle` returns a call's
    units and admits what now fits. A call that does not fit stays queued: backpressure.
    """

    def __init__(self, capacity: ToolCapacity) -> None:
        self.capacity = capacity
        self._waiting: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def offer(self, key: str, demand: Units) -> None:
        """Queue a call under its idempotency key; refuse one that could never fit."""
        if not self.capacity.can_ever_fit(demand):
            raise InvalidInput(f"tool call {key}: {dict(demand)} exceeds this host's capacity")
        with self._lock:
            self._waiting.setdefault(key, dict(demand))

    def admit(self) -> list[str]:
        """Acquire units for calls from the head of the queue while they fit; their keys."""
        admitted = []
        with self._lock:
            while self._waiting:
                key, demand = next(iter(self._waiting.items()))
                if not self.capacity.acquire(key, demand):
                    break
                del self._waiting[key]
                admitted.append(key)
        return admitted

    def settle(self, key: str) -> list[str]:
        """Release a finished call's units and admit whatever now fits."""
        self.capacity.release(key)
        return self.admit()

    def waiting(self) -> list[str]:
        """Keys still queued, head first."""
        with self._lock:
            return list(self._waiting)
