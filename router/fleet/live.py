"""A router following the fleet's configuration while it runs (``reins config apply``).

At each tick :class:`LiveConfig` reads the document's version (one ``HGET``); when it changed,
the router admits by the new version from then on. With the shared admitter the tenants,
weights, classes and credit cap go into the shared state (:meth:`RedisAdmitter.reconfigure`:
every replica admits by them from the first replica's tick on) and the gates' limits are
written again; a local admitter is rebuilt over the new version and refilled from the store.
A router given a tenants file follows the file, not the document. Design:
``docs/adr/0120-live-configuration.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kernel.errors import ConfigError
from router.admission.gates import GateConfig
from router.admission.tenants import AdmissionConfig
from router.fleet.config import ConfigSource, FleetConfig
from router.fleet.routes import NO_ROUTES, RouteTable

log = logging.getLogger("reins.router.config")


@dataclass
class Applied:
    """The configuration a router admits by: the document's version (0: a file) and content."""

    version: int
    admission: AdmissionConfig
    gates: GateConfig | None
    routes: RouteTable = NO_ROUTES


class LiveConfig:
    """Watches the document's version and hands each newer one to ``apply`` exactly once."""

    def __init__(
        self,
        source: ConfigSource | None,
        applied: Applied,
        apply: Callable[[Applied], None],
        *,
        gates_override: GateConfig | None = None,
    ) -> None:
        self.source, self.applied, self._apply = source, applied, apply
        self._gates_override = gates_override

    def tick(self) -> bool:
        """Apply a newer version of the document if there is one; True when it did.

        A document this build cannot read (a newer build wrote it) is logged and the router
        keeps the version it has: the rest of its tick goes on.
        """
        if self.source is None:
            return False
        try:
            fleet: FleetConfig | None = self.source.peek()
        except ConfigError as exc:
            log.error(
                "configuration not applied, keeping version %d: %s", self.applied.version, exc
            )
            return False
        if fleet is None or fleet.version <= self.applied.version:
            return False
        gates = self._gates_override if self._gates_override is not None else fleet.gates
        new = Applied(fleet.version, fleet.admission, gates, fleet.routes)
        self._apply(new)
        log.info("configuration version %d applied (was %d)", new.version, self.applied.version)
        self.applied = new
        return True
