"""Fleet-wide capacity of tools: a tool declared with a gate runs only while it holds a lease.

The fleet's document declares a tool's capacity as a gate route named ``tool/<tool name>``
(``concurrency = 4``: four calls of it at once across the fleet; ``rpm`` too if wanted), which
routers write into the shared gates like any provider's. Before it calls the tool's backend, a
worker debits that gate under the call's attempt id (a redelivered dispatch finds its own lease
and is not counted twice), keeps the lease alive while the call lasts (:class:`LeaseKeeper`)
and settles it when the call returns. A tool with no such gate runs at once. Design:
``docs/adr/0122-tool-gates.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from router.admission.gates import GateReading, ProviderLimits
from router.fleet.config import ConfigSource
from worker.leases import LeaseKeeper

log = logging.getLogger("reins.worker.tools")
TOOL_ROUTE_PREFIX = "tool/"
WAIT_S = (0.02, 0.5)  # first and longest pause between two debits the gate refused


class Debits(Protocol):
    """What a tool gate needs of the shared gates."""

    def debit(self, route: str, lease_id: str, tokens: int) -> GateReading: ...

    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> GateReading: ...

    def renew(self, route: str, lease_id: str) -> bool: ...


#: The longest a dispatch queues at its gate before the worker reports the wait (the kernel
#: then sends it again, so the wait is in the record and the re-check goes on).
RECHECK_S = 5.0


class NoCapacity(Exception):
    """The tool's gate had no room within the wait: the tool was not called."""

    def __init__(self, gate: str, reason: str) -> None:
        super().__init__(f"{gate}: no capacity ({reason})")
        self.gate, self.reason = gate, reason


def lease_ttl_s(source: ConfigSource, route: str) -> float:
    """The lease ttl of ``route`` in the fleet's document (the default ttl if it names none)."""
    fleet = source.peek()
    limits = fleet.gates.routes.get(route) if fleet is not None and fleet.gates else None
    return (limits or ProviderLimits()).lease_ttl_s


def gated_route(source: ConfigSource, route: str) -> bool:
    """Whether the fleet's document names ``route`` among its gates: only such a tool's calls
    ask the shared gates, so a tool without one costs no Redis round trip (the document is
    read from the source's cache, refreshed at most every few seconds)."""
    fleet = source.peek()
    return fleet is not None and fleet.gates is not None and route in fleet.gates.routes


def tool_route(tool: str) -> str:
    """The gate route of ``tool``'s capacity."""
    return TOOL_ROUTE_PREFIX + tool


class ToolGates:
    """Holds a tool's gate lease for the duration of each call (see the module docstring)."""

    def __init__(
        self,
        gates: Debits,
        leases: LeaseKeeper,
        ttl_of: Callable[[str], float],
        *,
        gated: Callable[[str], bool] = lambda route: True,
        clock: Callable[[], float] = time.monotonic,
        pause: Callable[[float], object] = time.sleep,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.gates, self.leases, self.ttl_of, self.gated = gates, leases, ttl_of, gated
        self.clock, self.pause = clock, pause
        self.recheck_s = recheck_s  # the longest one wait for a slot before it is reported

    @contextmanager
    def held(self, tool: str, lease: str, within_s: float) -> Iterator[None]:
        """Hold ``tool``'s gate lease for the ``with`` block; raise :class:`NoCapacity` if no
        room came within ``within_s`` (nothing held then). A tool without a gate: no lease."""
        route = tool_route(tool)
        if not self.gated(route):  # no gate declared: no lease, no round trip
            yield
            return
        reading = self._debit(route, lease, self.clock() + within_s)
        if reading is None:
            yield
            return
        self.leases.hold(route, lease, self.ttl_of(route))
        try:
            yield
        finally:
            self.leases.drop(lease)
            try:
                self.gates.settle(route, lease, 0)
            except Exception:  # Redis away: the lease lapses after its ttl
                log.exception("could not settle tool lease %s on %s", lease, route)

    def _debit(self, route: str, lease: str, deadline: float) -> GateReading | None:
        """The debit's reading once it passed; None for a tool without a gate."""
        wait = WAIT_S[0]
        while True:
            reading = self.gates.debit(route, lease, 0)
            if reading.ok:
                return reading
            if reading.reason == "unknown_route":
                return None
            if self.clock() + wait > deadline:
                raise NoCapacity(route, str(reading.reason))
            self.pause(wait)  # a slot frees when another call settles: ask again
            wait = min(wait * 2, WAIT_S[1])
