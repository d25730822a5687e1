"""The memory section of the fleet's document: how long each tenant's facts and episodes live.

A TOML document may carry::

    [memory]
    retention_days = 365          # every tenant's memory: deleted this long after it was written
    [memory.tenants.acme]
    retention_days = 30           # acme's

A tenant named in neither keeps ``REINS_MEMORY_RETENTION_DAYS``. Retention bounds every item,
facts (whatever expiry the model asked for) and episodes (which have none of their own); the
routers' memory sweep deletes what it passed (:mod:`router.process.memory_sweep`). A value that
is not above 0, an unknown key, or a tenant the document does not configure is refused, naming
it, and nothing is applied. Design: ``docs/adr/0142-memory-governance.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.errors import ConfigError

DAY_MS = 86_400_000


class TenantMemory(BaseModel):
    """One tenant's memory settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retention_days: float = Field(gt=0)


class MemoryConfig(BaseModel):
    """The memory section: a retention for every tenant, and some tenants' own."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    retention_days: float | None = Field(None, gt=0)
    tenants: dict[str, TenantMemory] = Field(default_factory=dict)

    def keep_ms(self, tenant: str, default_days: float) -> int:
        """How long ``tenant``'s memory items are kept after they were written, in ms."""
        own = self.tenants.get(tenant)
        days = own.retention_days if own else self.retention_days or default_days
        return int(days * DAY_MS)


#: A document without a memory section: every tenant keeps REINS_MEMORY_RETENTION_DAYS.
NO_MEMORY_SECTION = MemoryConfig()


def memory_of(raw: Any, document: Mapping[str, Any]) -> MemoryConfig:
    """The ``memory`` section ``raw`` of the fleet's ``document``, validated against the
    tenants the document names; refuses anything else with :class:`ConfigError` naming the
    field."""
    tenants = document.get("tenants")
    listed = tenants if isinstance(tenants, list) else []  # a malformed list is refused elsewhere
    names = [t.get("name") for t in listed if isinstance(t, Mapping)]
    return memory_config(raw, [n for n in names if isinstance(n, str)])


def memory_config(raw: Any, tenants: Iterable[str]) -> MemoryConfig:
    """A ``memory`` section validated against ``tenants``; refuses anything else with
    :class:`ConfigError` naming the field."""
    if raw is None:
        return NO_MEMORY_SECTION
    if not isinstance(raw, Mapping):
        raise ConfigError("memory: must be a table", field="memory")
    try:
        found = MemoryConfig.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("memory", *first["loc"]))
        raise ConfigError(f"{where}: {first['msg']}", field=where) from None
    unknown = sorted(set(found.tenants) - set(tenants))
    if unknown:
        raise ConfigError(
            f"memory.tenants: {unknown} are not tenants of this document", field="memory.tenants"
        )
    return found
