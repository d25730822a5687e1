"""Tenant configuration: who shares the model service, by what weight, within what limits.

:class:`AdmissionConfig` is read from a TOML or JSON file and validated once, at the edge: once
``from_file`` or ``from_mapping`` returns, every weight is positive, every name is unique and
the credit cap covers every tenant's largest call; anything else is a
:class:`~kernel.errors.ConfigError` naming the tenant and the field. Weights are relative shares
of the admitted charge (input tokens plus output allowance); classes split their tenant's share
the same way. Design: ``docs/adr/0001-weighted-drr-admission.md``. A file (TOML)::

    quantum_tokens = 8000          # charge credited per unit of weight per round
    credit_cap_tokens = 64000      # the most credit a tenant or class may carry
    [[tenants]]
    name = "acme"
    weight = 3
    max_ready = 500                # most READY trajectories it may queue
    largest_call_tokens = 42000    # largest input + output allowance of one call
    max_in_flight = 20             # most turns in flight across the fleet (omit: no cap)
    budget_max = { steps = 40, tokens = 1500000, dollars = "5.00" }
    retention_days = 90            # finished runs kept this long (unset: REINS_RETENTION_DAYS)
    classes = [ { name = "interactive", weight = 3 }, { name = "maintenance", weight = 1 } ]
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernel.errors import ConfigError

#: Name of the one implicit service class of a tenant that declares none.
DEFAULT_CLASS = "default"

#: The budget dimensions a tenant can bound; the same names a job's budget uses.
BUDGET_DIMENSIONS = ("steps", "tool_calls", "tokens", "dollars")

# Names end up in Redis keys and metric labels, so keep them plain.
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

#: Default admission-wait histogram bounds in seconds (Prometheus ``le`` semantics).
DEFAULT_WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BudgetMaxima(_Frozen):
    """The largest budget one trajectory of the tenant may ask for; None means no limit."""

    steps: int | None = Field(None, ge=1)
    tool_calls: int | None = Field(None, ge=0)
    tokens: int | None = Field(None, ge=1)
    dollars: Decimal | None = Field(None, gt=0)


class ServiceClassConfig(_Frozen):
    """A service class inside a tenant: its own FIFO queue and a weight within the tenant."""

    name: str = Field(pattern=_NAME)
    weight: float = Field(gt=0)


class TenantConfig(_Frozen):
    """One tenant: its weight, its classes, and the limits a submission must stay within."""

    name: str = Field(pattern=_NAME)
    weight: float = Field(gt=0)
    max_ready: int = Field(ge=1, description="most READY trajectories it may queue")
    largest_call_tokens: int = Field(ge=1, description="largest input + output allowance")
    # strict: 2.5, "2" or true is refused, not rounded or coerced into a cap
    max_in_flight: int | None = Field(
        None,
        ge=1,
        strict=True,
        description="most turns of the tenant in flight across the fleet; None: no cap",
    )
    budget_max: BudgetMaxima = BudgetMaxima()
    classes: tuple[ServiceClassConfig, ...] = ()
    retention_days: float | None = Field(
        None,
        gt=0,
        description="days a finished trajectory is kept after its last chain row; None: "
        "REINS_RETENTION_DAYS",
    )
    agents: tuple[str, ...] | None = Field(
        None,
        description="the agents (MODULE:AGENT) its jobs may name; None: not restricted, which "
        "only a trusted in-process caller accepts (the fleet's document must list them)",
    )

    @model_validator(mode="after")
    def _unique_classes(self) -> TenantConfig:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"tenant {self.name!r}: service class names repeat: {dup}")
        return self

    def allows(self, agent: str) -> bool:
        """True when a job of this tenant may name ``agent`` (no list: no restriction)."""
        return self.agents is None or agent in self.agents

    @property
    def class_names(self) -> tuple[str, ...]:
        """Its service classes in rotation order; the first is used when a job names none."""
        return tuple(c.name for c in self.classes) or (DEFAULT_CLASS,)

    @property
    def class_weights(self) -> tuple[float, ...]:
        """Weights of :attr:`class_names`, in the same order."""
        return tuple(c.weight for c in self.classes) or (1.0,)


class AdmissionConfig(_Frozen):
    """Every tenant plus the two numbers of the round-robin: quantum and credit cap.

    Invariant after validation: ``credit_cap_tokens >= largest_call_tokens`` of every tenant,
    because a call larger than the most credit its tenant can hold would never be admitted.
    A cap below ``largest call + quantum`` clips carried credit (visible in the fairness
    figures). Choosing both: ``docs/adr/0001-weighted-drr-admission.md``.
    """

    quantum_tokens: int = Field(ge=1, description="charge credited per unit weight per round")
    credit_cap_tokens: int = Field(ge=1, description="most credit a tenant or class may carry")
    fairness_window_s: float = Field(60.0, gt=0)
    wait_buckets_s: tuple[float, ...] = DEFAULT_WAIT_BUCKETS_S
    tenants: tuple[TenantConfig, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> AdmissionConfig:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ConfigError(f"tenant names repeat: {dup}")
        buckets = self.wait_buckets_s
        if not buckets or buckets[0] <= 0 or any(b >= a for b, a in pairwise(buckets)):
            raise ConfigError("wait_buckets_s must be positive and strictly increasing")
        short = [t for t in self.tenants if t.largest_call_tokens > self.credit_cap_tokens]
        if short:
            sizes = ", ".join(f"{t.name!r} ({t.largest_call_tokens:,})" for t in short)
            raise ConfigError(
                f"credit_cap_tokens {self.credit_cap_tokens:,} is below the largest call of "
                f"tenant {sizes}: such a call could never gather enough credit to be admitted; "
                f"raise the cap to at least {max(t.largest_call_tokens for t in short):,}"
            )
        for t in self.tenants:
            for what, w in (("", t.weight), *((f" class {c.name!r}", c.weight) for c in t.classes)):
                if round(self.quantum_tokens * w) < 1:
                    raise ConfigError(
                        f"tenant {t.name!r}{what}: quantum_tokens x weight {w} rounds to zero "
                        "credit per round; raise quantum_tokens or the weight"
                    )
        return self

    def tenant(self, name: str) -> TenantConfig | None:
        """The tenant called ``name``, or None."""
        for t in self.tenants:
            if t.name == name:
                return t
        return None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> AdmissionConfig:
        """Validate a parsed document; refuse anything unknown or out of range with ConfigError."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = _where(first["loc"], data)
            raise ConfigError(f"tenant configuration: {where}: {first['msg']}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> AdmissionConfig:
        """Load a ``.toml`` or ``.json`` file; dollar amounts parse as Decimal, never float."""
        return cls.from_mapping(read_document(path, "tenant configuration"))


def read_document(path: str | Path, what: str) -> dict[str, Any]:
    """A ``.toml`` or ``.json`` file as a mapping, dollar amounts as Decimal (never float); a
    :class:`ConfigError` naming ``what`` and the file when it cannot be read or parsed."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {p}: cannot read: {exc.strerror}") from None
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(raw.decode(), parse_float=Decimal)
        elif p.suffix == ".json":
            data = json.loads(raw, parse_float=Decimal)
        else:
            raise ConfigError(f"{what} {p}: expected a .toml or .json file")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {p}: not valid {p.suffix[1:]}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {p}: the document must be a table/object")
    return data


def _where(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    """Render a pydantic error location, naming the tenant instead of its list index."""
    parts: list[str] = []
    node: Any = data
    for key in loc:
        if isinstance(key, int) and isinstance(node, list | tuple) and 0 <= key < len(node):
            node = node[key]
            name = node.get("name") if isinstance(node, Mapping) else None
            parts[-1] = f"{parts[-1]}[{name!r}]" if name else f"{parts[-1]}[{key}]"
            continue
        parts.append(str(key))
        node = node.get(key) if isinstance(node, Mapping) else None
    return ".".join(parts) or "(document)"
