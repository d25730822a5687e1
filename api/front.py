"""What the API process holds: the store, the feed, the fleet's configuration, the keys, the
console's sessions, memory, and a router API (:class:`router.process.submit.RouterApi`) over
them that never admits.

The API queues a new trajectory with a notice on the feed, as a worker does (a router admits
it); it sends only what a decision or a control request itself asks (the tool dispatch an
approval admits), through the broker, its custody written first. Its router API is rebuilt
when the configuration's version changes. It writes no configuration and no gate limits.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from api.console.sessions import ConsoleSessions
from api.idempotency import IdempotencyKeys, body_digest
from api.keys import KeyRing
from api.problems import Problem
from kernel.errors import SnapshotNotFound, UnknownAgent
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import LifecycleState
from kernel.tools import Catalog
from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from router.fleet.agents import AgentCache
from router.fleet.config import ConfigSource, FleetConfig, authority_lookup, importable
from router.placement.membership import Membership
from router.placement.ring import Ring
from router.process.submit import RouterApi, Submission
from router.wire.broker import make_app
from router.wire.custody import Custody
from router.wire.feed import Feed, route_of
from router.wire.publishers import Publisher, publisher_for
from store.memory_redis import RedisMemory
from store.redis_async import async_client_for
from store.redis_client import client_for
from store.redis_store import RedisStore

log = logging.getLogger(__name__)


@dataclass
class Front:
    """The API's parts, wired from settings; see the module docstring."""

    settings: Settings
    client: redis.Redis
    store: RedisStore
    feed: Feed
    config: ConfigSource
    keys: KeyRing
    idempotency: IdempotencyKeys
    membership: Membership
    memory: RedisMemory
    sessions: ConsoleSessions
    agents: AgentCache = field(default_factory=AgentCache)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _send_lock: threading.Lock = field(default_factory=threading.Lock)
    _api: tuple[int, RouterApi] | None = None
    _publisher: Publisher | None = None
    _custody: Custody | None = None
    _tail: Any = None  # redis.asyncio.Redis, built on first use (in the event loop's process)

    @classmethod
    def wire(cls, settings: Settings, client: redis.Redis | None = None) -> Front:
        """Connect to the store's Redis (nothing is written)."""
        client = client if client is not None else client_for(settings)
        prefix = settings.key_prefix
        config = ConfigSource(client, prefix)
        keys = KeyRing(client, prefix, remember_s=settings.api_key_cache_s)
        sessions = ConsoleSessions(
            client,
            prefix,
            keys,
            lifetime_s=settings.console_session_s,
            idle_s=settings.console_idle_s,
        )
        return cls(
            settings=settings,
            client=client,
            store=RedisStore(client, prefix=prefix, retry_attempts=settings.redis_retry_attempts),
            feed=Feed(client, prefix),
            config=config,
            agents=AgentCache(importable(config), authority=authority_lookup(config)),
            keys=keys,
            sessions=sessions,
            idempotency=IdempotencyKeys(client, prefix),
            membership=Membership.of(client, settings),
            memory=RedisMemory(client, prefix=prefix, retry_attempts=settings.redis_retry_attempts),
        )

    def tail(self) -> Any:
        """An asyncio Redis client of the store's server, one node or a cluster (event streams
        read with it)."""
        if self._tail is None:
            self._tail = async_client_for(self.settings)
        return self._tail

    async def aclose(self) -> None:
        """Close the asyncio client (the app's shutdown)."""
        if self._tail is not None:
            await self._tail.aclose()
            self._tail = None

    def fleet(self) -> FleetConfig:
        """The configuration in force (ConfigError: none applied)."""
        return self.config.current()

    def held_back_by(self, rec: TrajectoryRecord) -> str | None:
        """For a READY run: its model route and why that route's gate holds its next call
        back now (the admitter's backpressure, asked again every cycle), or None. Read from
        the gate, not the record; a gate that cannot be read says nothing (logged)."""
        if rec.state is not LifecycleState.READY:
            return None
        try:
            model = self.agents.get(rec.agent)[0].profile.model
        except UnknownAgent:
            return None
        route = route_of(model.provider, model.name)
        gates = RedisGates(self.client, GateConfig(routes={}), prefix=self.settings.key_prefix)
        try:
            why = gates.reading(route).holds_back(time.time())
        except redis.RedisError as exc:
            log.warning("gate %s not read for %s: %s", route, rec.trajectory_id, exc)
            return None
        return None if why is None else f"{route} ({why})"

    def catalog_of(self, agent: str) -> Catalog | None:
        """The tools of ``agent``, or None when this process may not load it (off every list,
        or not installed here): a view then shows what the record alone holds."""
        try:
            return self.agents.get(agent)[0].profile.catalog
        except UnknownAgent:
            return None

    def router_api(self) -> RouterApi:
        """The router API over the configuration in force."""
        fleet = self.fleet()
        with self._lock:
            if self._api is None or self._api[0] != fleet.version:
                api = RouterApi(
                    store=self.store,
                    feed=self.feed,
                    config=fleet.admission,
                    agents=self.agents,
                    gate_config=fleet.gates,
                    admitter=None,
                    sender=self._send,
                    ring=self._ring,
                    memory=self.memory,
                )
                self._api = (fleet.version, api)
            return self._api[1]

    def _ring(self) -> Ring:
        return self.membership.build_ring()

    def _send(self, member: str, payload: dict[str, Any]) -> None:
        """Send a turn message now, its custody entry first (one at a time: custody buffers)."""
        with self._send_lock:
            if self._publisher is None or self._custody is None:
                self._publisher = publisher_for(self.settings, make_app(self.settings))
                self._custody = Custody(self.client, self.settings.key_prefix)
            self._custody.sending(self._publisher.send)(member, payload)

    def submit(
        self, tenant: str, body: dict[str, Any], idempotency_key: str | None
    ) -> tuple[Submission, bool]:
        """Create a trajectory of ``body`` for ``tenant``; see :meth:`RouterApi.submit`.

        The agent is checked against the tenant's allow-list before anything is imported.
        With ``idempotency_key``, a repeat names the trajectory already created for it (the
        second item is False then).
        """
        fleet = self.fleet()
        if not fleet.allows(tenant, str(body.get("agent", ""))):
            raise UnknownAgent(
                f"agent {body.get('agent')!r} is not among the agents your tenant may run; "
                "ask the operator to add it to the tenant's agents and apply the configuration"
            )
        api = self.router_api()
        if idempotency_key is None:
            return api.submit(tenant, body), True
        binding = self.idempotency.bind(tenant, idempotency_key, body)
        if not binding.fresh:
            return self._repeat(tenant, body, binding.body_digest, binding.trajectory_id), False
        try:
            return api.submit(tenant, {**body, "trajectory_id": binding.trajectory_id}), True
        except Exception:
            self.idempotency.release(tenant, idempotency_key)
            raise

    def _repeat(self, tenant: str, body: dict[str, Any], digest: str, tid: str) -> Submission:
        if body_digest(body) != digest:
            raise Problem(
                422,
                "Idempotency key reused",
                "this Idempotency-Key was used with another body; use a new key for a new job",
                field="Idempotency-Key",
                kind="idempotency-key-reused",
            )
        try:
            rec = self.store.load(tenant, tid)
        except SnapshotNotFound:
            raise Problem(
                409,
                "In progress",
                "a submission with this Idempotency-Key is still being created; retry shortly",
                field="Idempotency-Key",
                kind="idempotency-key-in-progress",
            ) from None
        return Submission(tenant, tid, rec.record_version, 0, 0, "")
