"""The tenant's memory: its facts and episodes, listed, recalled, read and deleted.

Every handler takes the tenant from the caller's key and passes it to the memory store, whose
every read and delete is scoped by it: another tenant's item id gets the very 404 an id that
exists nowhere gets, listings hold only the caller's items, and a recall's visibility is built
from the key's tenant, so it can neither see nor rank another tenant's rows. Reading needs the
``read`` scope, as does a user's export; deleting (an item, everything that concerns a user for
an erasure request, or everything one tool call's result shaped) needs ``control``. A user or a
call the tenant never saw gets an empty answer, exactly as one it saw and holds nothing of.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel

from api.auth import Authenticated, front_of, need
from api.keys import Scope as KeyScope
from api.problems import not_found
from kernel.memory import MemoryItem, MemoryKind, Provenance, Visibility, ms
from store.memory_base import MAX_RECALL

router = APIRouter(prefix="/v1/memory", tags=["memory"])
ItemId = Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")]
Name = Annotated[str, Path(min_length=1, max_length=200)]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such memory item"}}


class MemoryView(BaseModel):
    """One fact or episode as the API shows it."""

    item_id: str
    kind: MemoryKind
    scope: str
    subject: str
    key: str
    value: dict[str, Any]
    tags: list[str]
    written_ms: int
    expires_ms: int | None
    concerns: list[str]
    trajectory_id: str | None
    provenance: Provenance | None


class MemoryPage(BaseModel):
    """Items of the caller's tenant, newest first."""

    items: list[MemoryView]


class Erased(BaseModel):
    """What an erasure request deleted: every item that concerned the user."""

    user: str
    deleted: int
    items: list[MemoryView]


class Removed(BaseModel):
    """What a removal by source deleted: every item one tool call's result shaped."""

    call_id: str
    deleted: int
    items: list[MemoryView]


class Export(BaseModel):
    """Everything the tenant's memory holds about a user: the facts and episodes that concern
    them, newest first, and the trajectories those were written by."""

    user: str
    facts: list[MemoryView]
    episodes: list[MemoryView]
    trajectories: list[str]


def view_of(item: MemoryItem) -> MemoryView:
    """The API's view of one item."""
    return MemoryView(
        item_id=item.item_id,
        kind=item.kind,
        scope=item.scope.value,
        subject=item.subject,
        key=item.key,
        value=item.value,
        tags=list(item.tags),
        written_ms=item.written_ms,
        expires_ms=item.expires_ms,
        concerns=list(item.concerns),
        trajectory_id=item.trajectory_id,
        provenance=item.provenance,
    )


@router.get("", response_model=MemoryPage)
def list_memory(
    grant: Authenticated,
    request: Request,
    kind: MemoryKind | None = None,
    user: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> MemoryPage:
    """The tenant's facts and episodes (of ``kind``; that concern ``user``), newest first."""
    tenant = need(grant, KeyScope.READ)
    items = front_of(request).memory.items(tenant, kind, user)
    return MemoryPage(items=[view_of(i) for i in items])


@router.get("/recall", response_model=MemoryPage)
def recall(
    grant: Authenticated,
    request: Request,
    user: Annotated[str, Query(min_length=1, max_length=200)],
    agent: Annotated[str, Query(min_length=1, max_length=200)],
    tags: Annotated[list[str], Query(min_length=1)],
    kind: MemoryKind = MemoryKind.FACT,
    limit: Annotated[int, Query(ge=1, le=MAX_RECALL)] = 10,
) -> MemoryPage:
    """What an agent of this tenant, running for ``user``, would recall for ``tags``."""
    tenant = need(grant, KeyScope.READ)
    caller = Visibility(tenant, user, agent)
    found = front_of(request).memory.recall(caller, kind, tags, ms(time.time()), limit)
    return MemoryPage(items=[view_of(i) for i in found])


@router.get("/items/{item_id}", response_model=MemoryView, responses=NOT_FOUND)
def show_item(item_id: ItemId, grant: Authenticated, request: Request) -> MemoryView:
    """One fact or episode of the tenant."""
    tenant = need(grant, KeyScope.READ)
    item = front_of(request).memory.get(tenant, item_id)
    if item is None:
        raise not_found("memory item")
    return view_of(item)


@router.delete("/items/{item_id}", status_code=204, responses=NOT_FOUND)
def delete_item(item_id: ItemId, grant: Authenticated, request: Request) -> Response:
    """Delete one fact or episode of the tenant."""
    tenant = need(grant, KeyScope.CONTROL)
    if not front_of(request).memory.delete(tenant, item_id):
        raise not_found("memory item")
    return Response(status_code=204)


@router.delete("/users/{user}", response_model=Erased)
def erase_user(user: Name, grant: Authenticated, request: Request) -> Erased:
    """Delete every fact and episode of the tenant that concerns ``user``, whatever its scope
    (an erasure request); what was deleted."""
    tenant = need(grant, KeyScope.CONTROL)
    gone = front_of(request).memory.erase_user(tenant, user)
    return Erased(user=user, deleted=len(gone), items=[view_of(i) for i in gone])


@router.get("/users/{user}/export", response_model=Export)
def export_user(user: Name, grant: Authenticated, request: Request) -> Export:
    """Everything the tenant's memory holds about ``user``, as JSON."""
    tenant = need(grant, KeyScope.READ)
    held = front_of(request).memory.concerning(tenant, user)
    runs = {i.trajectory_id for i in held if i.trajectory_id}
    return Export(
        user=user,
        facts=[view_of(i) for i in held if i.kind is MemoryKind.FACT],
        episodes=[view_of(i) for i in held if i.kind is MemoryKind.EPISODE],
        trajectories=sorted(runs),
    )


@router.delete("/sources/{call_id:path}", response_model=Removed)
def erase_source(call_id: Name, grant: Authenticated, request: Request) -> Removed:
    """Delete every fact of the tenant that the result of tool call ``call_id`` shaped (a call
    id is ``TRAJECTORY/tN``, slash included, as the chain and ``reins memory ls`` show it)."""
    tenant = need(grant, KeyScope.CONTROL)
    gone = front_of(request).memory.erase_source(tenant, call_id)
    return Removed(call_id=call_id, deleted=len(gone), items=[view_of(i) for i in gone])
