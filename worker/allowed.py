"""The worker's own check of the agent allow-lists: a record whose agent its tenant may not run is
never loaded for a turn, so its module is never imported here.

:class:`AllowListedStore` is the worker's store with that check in :meth:`load`: the fleet's
configuration (:mod:`router.fleet.config`) names each tenant's agents; a record naming another
is refused with :class:`~kernel.errors.InvalidInput`, which the turn checks turn into an ignored
message (logged, the record untouched). A fleet run from files, with no document in Redis,
is not checked here (its routers check their own files at submission).
"""

from __future__ import annotations

from kernel.errors import InvalidInput
from kernel.record import TrajectoryRecord
from router.fleet.config import ConfigSource
from store.redis_store import RedisStore


class AgentNotAllowed(InvalidInput):
    """A record names an agent its tenant's configuration does not list."""


class AllowListedStore(RedisStore):
    """A :class:`RedisStore` whose :meth:`load` refuses records of agents not allowed."""

    source: ConfigSource | None = None

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        """The stored record, if its tenant may run its agent; see the module docstring."""
        rec = super().load(tenant, trajectory_id)
        fleet = self.source.peek() if self.source is not None else None
        if fleet is not None and not fleet.allows(tenant, rec.agent):
            raise AgentNotAllowed(
                f"trajectory {trajectory_id}: agent {rec.agent!r} is not allowed for tenant "
                f"{tenant!r} (fleet configuration v{fleet.version})"
            )
        return rec
