"""What operators allow a trajectory to do, checked at every tool dispatch.

Two sources, both set by operators and never by the model: the trajectory's own grants in the
record (the API's ``/grants`` and ``/freeze``) and its tenant's settings in the fleet's document
(:class:`TenantAuthority`, looked up through the kernel context). A call passes only if both
allow it (seed 004 war story 10.1: a freeze is an admission invariant at the dispatch
boundary, not text in the prompt).

A tool not granted, a denied target, or a tool with no finite liability to reserve is refused
to the model as a policy result (it may choose another step). A write under a freeze or a
read-only grant is held, not sent: it waits in the record with its reason until the operator
lifts it, then it is dispatched (or held for a reviewer, when its tool asks for one). Staged
escalation's restriction (seed 004 table 9) is the budget narrowing the run: it never lifts,
so its writes are refused, not held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernel.agent import Escalation
from kernel.record import EscalationStage, Grants, HoldReason, TrajectoryRecord
from kernel.tools import ToolKind, ToolSpec


@dataclass(frozen=True, slots=True)
class TenantAuthority:
    """An operator's settings for one tenant, from the fleet's document."""

    grants: Grants | None = None  # None: the tenant narrows nothing
    frozen: bool = False  # every write of the tenant waits
    escalation: Escalation | None = None  # staged escalation for the tenant's runs


#: The tenant's settings in force (None: none set); read at each step by the kernel.
AuthorityLookup = Callable[[str], TenantAuthority | None]


@dataclass(frozen=True, slots=True)
class Barrier:
    """Why a proposed call may not be sent now: ``hold`` True when it waits for an operator
    (``reason`` says which setting), False when it is refused to the model."""

    hold: bool
    code: str  # "not_granted", "denied_target", "restricted", or the hold's reason
    detail: str
    reason: HoldReason | None = None  # set when ``hold``


def barrier(
    rec: TrajectoryRecord, tenant: TenantAuthority | None, spec: ToolSpec, args: dict[str, Any]
) -> Barrier | None:
    """What stops ``spec`` called with ``args`` now, or None when nothing does. Refusals come
    before holds: a call no lifting could allow is never kept waiting."""
    sources = [rec.grants]
    if tenant is not None and tenant.grants is not None:
        sources.append(tenant.grants)
    target = str(args.get(spec.target_arg)) if spec.target_arg else None
    for grants in sources:
        if grants.tools is not None and spec.name not in grants.tools:
            return Barrier(False, "not_granted", f"{spec.name} is not granted")
        if target is not None and target in grants.denied_targets:
            return Barrier(False, "denied_target", f"{target} is a denied target")
    if spec.liability is None:
        return Barrier(False, "no_liability", f"{spec.name} has no finite liability to reserve")
    if spec.kind is not ToolKind.WRITE:
        return None
    if rec.escalation is EscalationStage.RESTRICT:
        return Barrier(False, "restricted", "the run is restricted to read-only tools")
    if rec.grants.frozen or (tenant is not None and tenant.frozen):
        whose = "the trajectory" if rec.grants.frozen else f"tenant {rec.tenant}"
        return Barrier(True, "frozen", f"{whose} is frozen", HoldReason.FREEZE)
    if any(g.read_only for g in sources):
        return Barrier(True, "read_only", "writes are not granted", HoldReason.READ_ONLY)
    return None
