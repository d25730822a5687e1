"""The fleet's one configuration: tenants, their agent allow-lists and the provider gates, in Redis.

``reins config apply FILE`` validates a document (TOML or JSON: the tenant configuration of
:mod:`router.admission.tenants`, every tenant naming the agents it may run in ``agents``, and the
gates of :mod:`router.admission.gates` under ``gates``) and writes it as the next version of one
Redis hash, ``<prefix>:fleet:config`` (``version``, ``document`` as JSON), in one ``MULTI``: a
reader sees a whole version or the one before, never a mix. Routers, workers and the API read it; no
other process writes it. :class:`ConfigSource` keeps the last version a process read and looks again
at most every ``refresh_s``. Design: ``docs/adr/0110-api.md``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import redis

from kernel.authority import TenantAuthority
from kernel.errors import ConfigError
from router.admission.gates import GateConfig
from router.admission.tenants import AdmissionConfig, read_document
from router.fleet.agents import load_agent
from router.fleet.authority_config import (
    NO_AUTHORITY,
    AuthorityConfig,
    authority_of,
    check_tools,
)
from router.fleet.memory_config import NO_MEMORY_SECTION, MemoryConfig, memory_of
from router.fleet.routes import NO_ROUTES, ROUTES, RouteTable, parse_models


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """One version of the fleet's configuration, validated."""

    version: int
    admission: AdmissionConfig
    gates: GateConfig | None
    memory: MemoryConfig = NO_MEMORY_SECTION  # the document's [memory] section
    routes: RouteTable = NO_ROUTES  # routed models (router/fleet/routes.py)
    authority: AuthorityConfig = NO_AUTHORITY  # tenants' grants, freezes, escalation

    def allows(self, tenant: str, agent: str) -> bool:
        """True when ``tenant`` is configured and lists ``agent`` among those it may run."""
        cfg = self.admission.tenant(tenant)
        return cfg is not None and cfg.agents is not None and agent in cfg.agents

    def lists(self, agent: str) -> bool:
        """True when some tenant lists ``agent``: the only agents a process may import."""
        return listed_anywhere(self.admission, agent)


def listed_anywhere(admission: AdmissionConfig, agent: str) -> bool:
    """True when some tenant lists ``agent``, or some tenant has no list (files of a trusted
    deployment that restricts nothing)."""
    return any(t.agents is None or agent in t.agents for t in admission.tenants)


def importable(source: ConfigSource) -> Callable[[str], bool]:
    """For :class:`router.fleet.agents.AgentCache`: the agents some tenant of the configuration in
    force lists (any, while no configuration was applied: a fleet run from files)."""

    def allowed(agent: str) -> bool:
        fleet = source.peek()
        return fleet is None or fleet.lists(agent)

    return allowed


def authority_lookup(source: ConfigSource) -> Callable[[str], TenantAuthority | None]:
    """For :class:`kernel.context.KernelContext`: a tenant's grants, freeze and escalation in
    the configuration in force (none while no configuration was applied)."""

    def lookup(tenant: str) -> TenantAuthority | None:
        fleet = source.peek()
        return None if fleet is None else fleet.authority.of(tenant)

    return lookup


def config_key(prefix: str) -> str:
    """The Redis hash holding the configuration under ``prefix``."""
    return f"{prefix}:fleet:config"


def parse_document(data: Mapping[str, Any]) -> tuple[AdmissionConfig, GateConfig | None]:
    """Validate a parsed document; raise :class:`ConfigError` naming the field.

    Unlike a tenants file given to one router, every tenant must list its agents: the fleet's
    document is what the API admits submissions by. The gates include those of the routed
    models (:func:`parse_routes` gives the routes themselves).
    """
    body = dict(data)
    gates_raw = body.pop("gates", None)
    memory_of(body.pop("memory", None), data)  # validated here, read by load()
    authority_in(body.pop("authority", None), data)  # validated here, read by load()
    routes = parse_models(body.pop("models", None))
    admission = AdmissionConfig.from_mapping(body)
    unlisted = [t.name for t in admission.tenants if t.agents is None]
    if unlisted:
        raise ConfigError(
            f'tenants {unlisted} list no agents: add agents = ["MODULE:AGENT", ...] to each '
            "(the agents its jobs may name)"
        )
    gates = None if gates_raw is None else GateConfig.from_mapping(gates_raw)
    return admission, with_route_gates(gates, routes)


def authority_in(raw: Any, document: Mapping[str, Any]) -> AuthorityConfig:
    """The ``authority`` section ``raw`` of ``document``, validated against its tenants."""
    tenants = document.get("tenants")
    listed = tenants if isinstance(tenants, list) else []  # a malformed list is refused elsewhere
    names = [t.get("name") for t in listed if isinstance(t, Mapping)]
    return authority_of(raw, [n for n in names if isinstance(n, str)])


def check_granted_tools(data: Mapping[str, Any], admission: AdmissionConfig) -> None:
    """Refuse a document whose grants name a tool none of the tenant's agents declares
    (imports the agents the grants concern; done when a document is applied, not read)."""

    def agents_of(tenant: str) -> list[str]:
        cfg = admission.tenant(tenant)
        return list(cfg.agents or ()) if cfg is not None else []

    check_tools(authority_in(data.get("authority"), data), agents_of, load_agent)


def parse_routes(data: Mapping[str, Any]) -> RouteTable:
    """The routed models of a parsed document (validated as :func:`parse_document` does)."""
    return parse_models(data.get("models"))


def with_route_gates(gates: GateConfig | None, routes: RouteTable) -> GateConfig | None:
    """``gates`` with the routed models' gates added; a document that names one of those in
    its ``gates`` section is refused (they are set under ``models``)."""
    added = routes.gates()
    if not added:
        return gates
    own = dict(gates.routes) if gates is not None else {}
    taken = sorted(r for r in own if r.split("/", 1)[0] == ROUTES)
    if taken:
        raise ConfigError(
            f"gates.routes {taken}: gates of routed models are set under models "
            '(models."NAME".gates, and each route\'s gates)',
            field="gates.routes",
        )
    return GateConfig(routes={**own, **added})


def read_file(path: str | Path) -> dict[str, Any]:
    """A ``.toml`` or ``.json`` document as a mapping; dollar amounts parse as Decimal."""
    return read_document(path, "fleet configuration")


def _plain(value: Any) -> Any:
    """JSON-ready: Decimal as a string (never a float), the rest as it is."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def apply(client: redis.Redis, prefix: str, data: Mapping[str, Any]) -> int:
    """Validate ``data`` and store it as the next version; return that version.

    Invalid input raises :class:`ConfigError` and writes nothing.
    """
    admission, _ = parse_document(data)
    check_granted_tools(data, admission)
    document = json.dumps(_plain(data), sort_keys=True)
    key = config_key(prefix)
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(key, "version", 1)
    pipe.hset(key, "document", document)
    version, _ = pipe.execute()
    return int(version)


def edit(client: redis.Redis, prefix: str, change: Callable[[dict[str, Any]], None]) -> int:
    """Apply ``change`` to the stored document and store the result as the next version (a
    document applied meanwhile is read again and changed again); return that version. A
    result that does not validate raises :class:`ConfigError` and writes nothing."""
    key = config_key(prefix)
    while True:
        with client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]
                raw = pipe.hget(key, "document")
                if raw is None:
                    require(client, prefix)  # raises, saying what to run
                data = json.loads(cast(bytes, raw), parse_float=Decimal)
                change(data)
                admission, _ = parse_document(data)
                check_granted_tools(data, admission)
                pipe.multi()
                pipe.hincrby(key, "version", 1)
                pipe.hset(key, "document", json.dumps(_plain(data), sort_keys=True))
                version, _ = pipe.execute()
                return int(version)
            except redis.WatchError:
                continue


def tenant_settings(data: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The ``authority.tenants.<tenant>`` table of a parsed document, made if absent."""
    section = data.setdefault("authority", {})
    tenants = section.setdefault("tenants", {}) if isinstance(section, dict) else None
    if not isinstance(tenants, dict):
        raise ConfigError("authority: must be a table", field="authority")
    own = tenants.setdefault(tenant, {})
    if not isinstance(own, dict):
        raise ConfigError(f"authority.tenants.{tenant}: must be a table")
    return own


def load(client: redis.Redis, prefix: str) -> FleetConfig | None:
    """The stored configuration, or None when none was applied."""
    raw = cast(list[Any], client.hmget(config_key(prefix), "version", "document"))
    if raw[0] is None or raw[1] is None:
        return None
    data = json.loads(raw[1], parse_float=Decimal)
    admission, gates = parse_document(data)
    memory = memory_of(data.get("memory"), data)
    return FleetConfig(
        int(raw[0]),
        admission,
        gates,
        memory=memory,
        routes=parse_routes(data),
        authority=authority_in(data.get("authority"), data),
    )


def stored_version(client: redis.Redis, prefix: str) -> int:
    """The stored version (0: none applied)."""
    raw = client.hget(config_key(prefix), "version")
    return 0 if raw is None else int(cast(bytes, raw))


def require(client: redis.Redis, prefix: str) -> FleetConfig:
    """The stored configuration; :class:`ConfigError` saying what to run when there is none."""
    found = load(client, prefix)
    if found is None:
        raise ConfigError(
            f"no fleet configuration under {prefix!r}: run 'reins config apply FILE' first"
        )
    return found


class ConfigSource:
    """The configuration as one process sees it: the last version read, looked at again (one
    ``HGET`` of the version) at most every ``refresh_s``, and re-read when it changed."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.prefix, self.refresh_s, self.clock = client, prefix, refresh_s, clock
        self._lock = threading.Lock()
        self._current: FleetConfig | None = None
        self._checked_at = float("-inf")

    def current(self) -> FleetConfig:
        """The configuration in force; :class:`ConfigError` if none was ever applied."""
        found = self.peek()
        if found is None:
            return require(self.client, self.prefix)  # raises, saying what to run
        return found

    def peek(self) -> FleetConfig | None:
        """Like :meth:`current`, but None when no configuration was applied (an absence is
        remembered for ``refresh_s`` too)."""
        now = self.clock()
        with self._lock:
            if now - self._checked_at >= self.refresh_s:
                self._refresh()
                self._checked_at = now
            return self._current

    def _refresh(self) -> None:
        held = self._current
        if held is not None and stored_version(self.client, self.prefix) == held.version:
            return
        self._current = load(self.client, self.prefix)
