"""Booting a router process: its options, and the parts wired from its settings and files.

Nothing here runs a loop or starts a thread: :meth:`RouterParts.wire` connects (one Redis
client for the store, a broker connection unless a sender is given), reads the tenant and gate
configurations, and builds the parts :class:`router.process.service.RouterService` runs.
:class:`Admission` builds a dispatcher over a fresh admitter of the configured kind, at boot
and again whenever a local admitter's lease changes hands (:mod:`router.process.chores`).
"""

from __future__ import annotations

import json
import time
import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import redis

from kernel.errors import ConfigError
from kernel.settings import Settings
from router.admission.claims import Claiming
from router.admission.fifo import FifoAdmitter
from router.admission.gates import GateConfig, MemoryGates, ProviderGates
from router.admission.local import Admitter
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig
from router.fleet import config as fleet_config
from router.fleet.agents import AgentCache
from router.fleet.live import Applied
from router.fleet.observe import RouterObserver
from router.fleet.routes import fixed
from router.placement.membership import Membership, ReplicaRing
from router.process.dispatch import Dispatcher, Sender
from router.wire.broker import make_app
from router.wire.custody import Custody
from router.wire.feed import Feed
from router.wire.publishers import Publisher, publisher_for
from store.memory_redis import RedisMemory
from store.redis_client import client_for
from store.redis_store import RedisStore


class AdmitterKind(StrEnum):
    """Which admitter a router runs."""

    REDIS = "redis"  # shared by every router (weighted DRR, gates in Redis)
    DRR = "drr"  # weighted DRR in this process; one router admits at a time
    FIFO = "fifo"  # first come, first served in this process (the fairness peer)


@dataclass
class RouterOptions:
    """What ``reins router`` is told beyond the settings."""

    name: str
    tenants_file: str
    gates_file: str = ""
    admitter: AdmitterKind = AdmitterKind.REDIS
    claim_ttl_s: float = 30.0
    batch: int = 256


def load_gate_config(path: str) -> GateConfig | None:
    """The gate configuration in ``path`` (.toml or .json), or None when no file is named."""
    if not path:
        return None
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if p.suffix == ".toml" else json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"gate configuration {p}: {exc}") from None
    return GateConfig.from_mapping(data)


def fleet_configuration(client: redis.Redis, prefix: str, options: RouterOptions) -> Applied:
    """The tenants and gates a router runs by: its files when it is given a tenants file (a
    router on its own; version 0), otherwise the fleet's document in Redis (``reins config
    apply``) as read at boot, which :class:`router.fleet.live.LiveConfig` follows from then on;
    a gates file given still replaces the document's gates."""
    if options.tenants_file:
        config = AdmissionConfig.from_file(options.tenants_file)
        return Applied(0, config, load_gate_config(options.gates_file))
    fleet = fleet_config.load(client, prefix)
    if fleet is None:
        raise ConfigError(
            "no tenant configuration: run 'reins config apply FILE' (the fleet's document in "
            "Redis), or name a file with REINS_TENANTS_FILE or --tenants"
        )
    gates = load_gate_config(options.gates_file) if options.gates_file else fleet.gates
    return Applied(fleet.version, fleet.admission, gates, fleet.routes)


@dataclass
class Outbox:
    """How a router's turn messages leave: each one's custody entry is written before it is sent.

    ``turn`` sends an admitted turn; through the broker it is buffered until :meth:`flush`.
    ``now`` sends at once (the router API's sends, outside the cycle).
    """

    turn: Sender
    now: Sender
    custody: Custody
    publisher: Publisher | None = None

    @classmethod
    def wire(cls, settings: Settings, custody: Custody, sender: Sender | None) -> Outbox:
        """Through the broker of ``settings``, or through ``sender`` (tests, in process)."""
        if sender is not None:
            send = custody.sending(sender)
            return cls(send, send, custody)
        publisher = publisher_for(settings, make_app(settings))
        turn = custody.buffering(publisher.turn)  # flushed before the publisher
        return cls(turn, custody.sending(publisher.send), custody, publisher)

    def flush(self) -> None:
        """Register before send: the buffered custody first, then the buffered messages."""
        self.custody.flush()
        if self.publisher is not None:
            self.publisher.flush()


@dataclass
class Admission:
    """Builds a dispatcher over a fresh admitter of the configured kind (and fresh gates)."""

    name: str
    settings: Settings
    options: RouterOptions
    client: redis.Redis
    config: AdmissionConfig
    gate_config: GateConfig | None
    feed: Feed
    agents: AgentCache
    replica: ReplicaRing
    sender: Sender
    observer: RouterObserver
    version: int = 0  # of the fleet's document (0: a file)

    @property
    def shared(self) -> bool:
        """True for the admitter every router shares (in Redis)."""
        return self.options.admitter is AdmitterKind.REDIS

    def dispatcher(self, store: RedisStore) -> Dispatcher:
        """A dispatcher over ``store`` and a fresh admitter (and, when local, fresh gates)."""
        prefix, gate_config = self.settings.key_prefix, self.gate_config
        if self.shared:
            gates = RedisGates(self.client, gate_config or GateConfig(routes={}), prefix=prefix)
            gates.configure()
            redis_admitter = RedisAdmitter(
                self.client,
                self.config,
                prefix=prefix,
                gates=gates,
                claim_ttl_s=self.options.claim_ttl_s,
                version=self.version,
            )
            return self._with(store, redis_admitter, gates)
        local_gates = MemoryGates(gate_config, time.time) if gate_config else None
        routes = tuple(gate_config.routes) if gate_config else ()
        kind = FifoAdmitter if self.options.admitter is AdmitterKind.FIFO else Admitter
        local = kind(self.config, time.time, gates=local_gates, routes=routes, owner=self.name)
        return self._with(store, local, local_gates)

    def _with(
        self, store: RedisStore, admitter: Claiming, gates: ProviderGates | None
    ) -> Dispatcher:
        return Dispatcher(
            name=self.name,
            store=store,
            admitter=admitter,
            feed=self.feed,
            agents=self.agents,
            ring=lambda: self.replica.ring,
            sender=self.sender,
            gates=gates,
            gate_config=self.gate_config,
            observer=self.observer,
            follow_on_turns=self.settings.follow_on_turns,
            memory=RedisMemory(  # the runs it ends at admission leave their episodes
                self.client,
                prefix=self.settings.key_prefix,
                retry_attempts=self.settings.redis_retry_attempts,
            ),
        )


@dataclass
class RouterParts:
    """What a router process runs on, wired from its settings; nothing is running yet."""

    client: redis.Redis
    store: RedisStore
    feed: Feed
    membership: Membership
    replica: ReplicaRing
    config: AdmissionConfig
    gate_config: GateConfig | None
    agents: AgentCache
    custody: Custody
    outbox: Outbox
    admission: Admission

    @classmethod
    def wire(
        cls,
        settings: Settings,
        options: RouterOptions,
        *,
        client: redis.Redis | None,
        sender: Sender | None,
        observer: RouterObserver,
    ) -> RouterParts:
        """Connect and read the configuration; raises :class:`ConfigError` naming what is wrong.

        ``client`` replaces the store's client from ``REINS_REDIS_URL``; ``sender`` replaces
        the broker (no broker connection is made then).
        """
        client = client if client is not None else client_for(settings)
        prefix = settings.key_prefix
        store = RedisStore(client, prefix=prefix, retry_attempts=settings.redis_retry_attempts)
        feed = Feed(
            client,
            prefix,
            router=options.name,
            reclaim_after_s=settings.heartbeat_timeout_s,
            on_poison=observer.on_poison,
        )
        feed.create_groups()
        membership = Membership.of(client, settings)
        replica = ReplicaRing(membership, options.name)
        applied = fleet_configuration(client, prefix, options)
        config, gate_config = applied.admission, applied.gates
        observer.on_config(config)
        followed = None if options.tenants_file else fleet_config.ConfigSource(client, prefix)
        agents = AgentCache(
            lambda ref: fleet_config.listed_anywhere(config, ref),
            fixed(applied.routes),
            None if followed is None else fleet_config.authority_lookup(followed),
        )
        custody = Custody(client, prefix)
        outbox = Outbox.wire(settings, custody, sender)
        admission = Admission(
            options.name,
            settings,
            options,
            client,
            config,
            gate_config,
            feed,
            agents,
            replica,
            outbox.turn,
            observer,
            applied.version,
        )
        return cls(
            client,
            store,
            feed,
            membership,
            replica,
            config,
            gate_config,
            agents,
            custody,
            outbox,
            admission,
        )
