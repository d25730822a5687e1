"""The authority section of the fleet's document: each tenant's grants, freeze and escalation.

A document may carry::

    [authority.tenants.acme]
    frozen = true                       # every write of acme's runs is held, not sent
    [authority.tenants.acme.grants]
    tools = ["get_order", "search_policy"]   # the tools acme's runs may call (absent: all)
    read_only = false                   # true: writes are held
    denied_targets = ["ord_1004"]       # targets no call may name
    [authority.tenants.acme.escalation] # staged escalation (seed 004 table 9), turned on
    steer = 3                           # at this many calls left at the current liability
    restrict = 1

The kernel checks them at every dispatch (:mod:`kernel.authority`). A tenant the document does
not configure, an unknown key or stage, or (when the document is applied) a tool none of the
tenant's agents declares is refused naming the field, and nothing is applied. ``finalize`` is no
setting: it is the admission refusal itself, when the next call no longer fits beside the
reserve. Design: ``docs/adr/0215-operator-authority.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.agent import AgentModule, Escalation
from kernel.authority import TenantAuthority
from kernel.errors import ConfigError, ReinsError
from kernel.record import EscalationStage, Grants

#: The stages a document may turn on, with the field of :class:`Escalation` each sets.
STAGES = {
    EscalationStage.STEER.value: "steer_at_calls",
    EscalationStage.RESTRICT.value: "restrict_at_calls",
}
NEVER = -1  # a stage the document does not turn on: no number of calls left reaches it


class TenantGrants(BaseModel):
    """One tenant's grants as the document writes them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tools: list[str] | None = None
    read_only: bool = False
    denied_targets: list[str] = Field(default_factory=list)


class TenantSettings(BaseModel):
    """One tenant's authority settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    frozen: bool = False
    grants: TenantGrants | None = None
    escalation: dict[str, int] | None = None  # stage -> calls left at which it begins

    def kernel_form(self) -> TenantAuthority:
        """What the kernel checks at dispatch."""
        grants = None if self.grants is None else Grants(**self.grants.model_dump())
        escalation = None
        if self.escalation is not None:
            at = {field: self.escalation.get(stage, NEVER) for stage, field in STAGES.items()}
            escalation = Escalation(**at)
        return TenantAuthority(grants=grants, frozen=self.frozen, escalation=escalation)


class AuthorityConfig(BaseModel):
    """The authority section: some tenants' settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenants: dict[str, TenantSettings] = Field(default_factory=dict)

    def of(self, tenant: str) -> TenantAuthority | None:
        """The kernel's form of ``tenant``'s settings (None: none set)."""
        own = self.tenants.get(tenant)
        return None if own is None else own.kernel_form()


#: A document without an authority section: nothing narrowed, nothing frozen.
NO_AUTHORITY = AuthorityConfig()


def authority_of(raw: Any, tenants: Iterable[str]) -> AuthorityConfig:
    """An ``authority`` section validated against the document's ``tenants``; refuses anything
    else with :class:`ConfigError` naming the field."""
    if raw is None:
        return NO_AUTHORITY
    if not isinstance(raw, Mapping):
        raise ConfigError("authority: must be a table", field="authority")
    try:
        found = AuthorityConfig.model_validate(dict(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in ("authority", *first["loc"]))
        raise ConfigError(f"{where}: {first['msg']}", field=where) from None
    known = set(tenants)
    for name, settings in sorted(found.tenants.items()):
        if name not in known:
            where = f"authority.tenants.{name}"
            raise ConfigError(f"{where}: {name!r} is not a tenant of this document", field=where)
        _check_stages(name, settings)
    return found


def _check_stages(tenant: str, settings: TenantSettings) -> None:
    for stage, calls in sorted((settings.escalation or {}).items()):
        where = f"authority.tenants.{tenant}.escalation.{stage}"
        if stage not in STAGES:
            hint = (
                "finalize is no setting: it is the admission refusal when the next call no "
                "longer fits beside the reserve"
                if stage == "finalize"
                else f"known stages: {', '.join(STAGES)}"
            )
            raise ConfigError(f"{where}: unknown stage {stage!r}; {hint}", field=where)
        if calls < 0:
            raise ConfigError(f"{where}: must be 0 or more calls left", field=where)


def check_tools(
    found: AuthorityConfig,
    agents_of: Callable[[str], Iterable[str]],
    load: Callable[[str], AgentModule],
) -> None:
    """Refuse, naming the field, a granted tool that none of the tenant's agents declares
    (``agents_of`` gives a tenant's agent references; ``load`` imports one). A tenant whose
    agents cannot be imported here cannot have its tools checked, and is refused too."""
    for tenant, settings in sorted(found.tenants.items()):
        if settings.grants is None or settings.grants.tools is None:
            continue
        where = f"authority.tenants.{tenant}.grants.tools"
        declared: set[str] = set()
        for ref in agents_of(tenant):
            try:
                declared.update(load(ref).profile.catalog.tools)
            except ReinsError as exc:
                raise ConfigError(
                    f"{where}: cannot check the tools of agent {ref!r} here: {exc}", field=where
                ) from None
        unknown = sorted(set(settings.grants.tools) - declared)
        if unknown:
            raise ConfigError(
                f"{where}: {unknown} are tools of none of {tenant}'s agents "
                f"(they declare {sorted(declared)})",
                field=where,
            )
