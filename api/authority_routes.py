"""Grants and freezes: a trajectory's (tenant keys with the control scope) and a tenant's in
the fleet's document (operator keys). Registered before :mod:`api.routes`, whose
``/trajectories/{id}/{control}`` would otherwise take ``/grants`` and ``/freeze``.

A trajectory's grants and freeze are a kernel event (:class:`kernel.events.GrantsChanged`): a
write held by the freeze is sent at once when it is lifted. A tenant's are the next version of
the document (:func:`router.fleet.config.edit`), which routers, workers and the API read within
seconds; a held write is sent at the router's next tick. Refusals change nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict

from api.auth import Authenticated, front_of, need, need_operator
from api.keys import Scope
from api.problems import Problem, not_found
from api.views import Acknowledged
from kernel.errors import ConfigError, SnapshotNotFound
from kernel.events import Event, GrantsChanged
from kernel.record import Grants
from router.fleet import config as fleet_config

router = APIRouter(prefix="/v1", tags=["authority"])
TrajectoryId = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
TenantName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]


class FreezeRequest(BaseModel):
    """Freeze (the default) or lift the freeze."""

    model_config = ConfigDict(extra="forbid")

    frozen: bool = True


class GrantsRequest(BaseModel):
    """The grants to set: tools allowed (None: all), read-only, denied targets."""

    model_config = ConfigDict(extra="forbid")

    tools: list[str] | None = None
    read_only: bool = False
    denied_targets: list[str] = []


def _deliver(request: Request, tenant: str, trajectory_id: str, event: Event) -> Acknowledged:
    front = front_of(request)
    try:
        front.store.load(tenant, trajectory_id)
    except SnapshotNotFound:
        raise not_found() from None
    result = front.router_api().deliver(tenant, trajectory_id, event)
    rec = result.record
    return Acknowledged(
        trajectory_id=trajectory_id,
        version=rec.record_version,
        state=rec.state.value,
        detail={"grants": rec.grants.model_dump(mode="json"), "note": result.note},
    )


def _event(grant: Any, **fields: Any) -> GrantsChanged:
    rid = f"grants-{uuid.uuid4().hex[:12]}"
    # The fleet's wall clock: the records' times are on it.
    return GrantsChanged(now=time.time(), request_id=rid, requested_by=grant.principal, **fields)


def _edit(request: Request, change: Callable[[dict[str, Any]], None]) -> int:
    """The document's next version with ``change``; a change that does not validate is a 422
    naming the field, and nothing is written."""
    front = front_of(request)
    try:
        return fleet_config.edit(front.client, front.settings.key_prefix, change)
    except ConfigError as exc:
        raise Problem(422, "Invalid setting", str(exc), field=exc.field) from None


@router.post("/trajectories/{trajectory_id}/freeze", response_model=Acknowledged)
def freeze_trajectory(
    trajectory_id: TrajectoryId,
    grant: Authenticated,
    request: Request,
    body: FreezeRequest | None = None,
) -> Acknowledged:
    """Freeze the trajectory (its writes are held, not sent), or lift its freeze."""
    tenant = need(grant, Scope.CONTROL)
    frozen = body.frozen if body is not None else True
    return _deliver(request, tenant, trajectory_id, _event(grant, frozen=frozen))


@router.post("/trajectories/{trajectory_id}/grants", response_model=Acknowledged)
def set_grants(
    trajectory_id: TrajectoryId, body: GrantsRequest, grant: Authenticated, request: Request
) -> Acknowledged:
    """Set the trajectory's grants (its freeze is kept as it is)."""
    tenant = need(grant, Scope.CONTROL)
    grants = Grants(**body.model_dump())
    return _deliver(request, tenant, trajectory_id, _event(grant, grants=grants))


@router.post("/tenants/{tenant}/freeze", tags=["fleet"])
def freeze_tenant(
    tenant: TenantName, grant: Authenticated, request: Request, body: FreezeRequest | None = None
) -> dict[str, Any]:
    """Freeze a tenant in the fleet's document (operator keys), or lift its freeze."""
    need_operator(grant)
    frozen = body.frozen if body is not None else True

    def change(data: dict[str, Any]) -> None:
        fleet_config.tenant_settings(data, tenant)["frozen"] = frozen

    return {"tenant": tenant, "frozen": frozen, "version": _edit(request, change)}


@router.post("/tenants/{tenant}/grants", tags=["fleet"])
def set_tenant_grants(
    tenant: TenantName, body: GrantsRequest, grant: Authenticated, request: Request
) -> dict[str, Any]:
    """Set a tenant's grants in the fleet's document (operator keys)."""
    need_operator(grant)

    def change(data: dict[str, Any]) -> None:
        fleet_config.tenant_settings(data, tenant)["grants"] = body.model_dump(exclude_none=True)

    return {"tenant": tenant, "grants": body.model_dump(), "version": _edit(request, change)}
