"""The operator's endpoints: the ring and its members, drain and remove (operator keys only)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from api.auth import Authenticated, front_of, need_operator
from api.problems import Problem
from kernel.errors import RingError

router = APIRouter(prefix="/v1/fleet", tags=["fleet"])
MemberName = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")]


@router.get("/ring")
def ring(grant: Authenticated, request: Request) -> dict[str, Any]:
    """Every member with its state, weight and drain flag; the replicas' published rings."""
    need_operator(grant)
    membership = front_of(request).membership
    members = [
        {
            "name": r.name,
            "weight": r.weight,
            "draining": r.draining,
            "live": r.live,
        }
        for r in membership.records()
    ]
    replicas = [
        {"replica": r.replica_id, "live": r.live, "active": sorted(r.active)}
        for r in membership.replicas()
    ]
    return {"members": members, "replicas": replicas}


@router.post("/workers/{name}/drain")
def drain(name: MemberName, grant: Authenticated, request: Request) -> dict[str, Any]:
    """Stop new placements on the worker; its work in flight finishes."""
    need_operator(grant)
    membership = front_of(request).membership
    try:
        membership.drain(name)
    except RingError as exc:
        raise Problem(404, "Not found", str(exc), field="name") from None
    status = membership.drain_status(name)
    return {"name": name, "draining": True, "acknowledged": status.acknowledged}


@router.post("/workers/{name}/remove")
def remove(
    name: MemberName, grant: Authenticated, request: Request, force: bool = False
) -> dict[str, Any]:
    """Remove a draining worker from the ring (or any, with ``force``)."""
    need_operator(grant)
    membership = front_of(request).membership
    record = next((r for r in membership.records() if r.name == name), None)
    if record is None:
        raise Problem(404, "Not found", f"no worker {name!r} in the ring", field="name")
    if not record.draining and not force:
        raise Problem(
            409,
            "Not draining",
            f"drain {name} first (POST /v1/fleet/workers/{name}/drain), or pass force=true",
            field="name",
        )
    membership.remove(name)
    return {"name": name, "removed": True}
