"""The tenant's memory: its facts and episodes, listed, recalled, read and deleted.

Every handler takes the tenant from the caller's key and passes it to the memory store, whose
every read and delete is scoped by it: another tenant's item id gets the very 404 an id that
exists nowhere gets, listings hold only the caller's items, and a recall's visibility is built
from the key's tenant, so it can neither see nor rank another tenant's rows. Reading needs the
``read`` scope; deleting (an item, or everything in a user's own scope for an erasure request)
needs ``control``.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel

from api.auth import Authenticated, front_of, need
from api.keys import Scope as KeyScope
from api.problems import not_found
from kernel.memory import MemoryItem, MemoryKind, Visibility, ms
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


class MemoryPage(BaseModel):
    """Items of the caller's tenant, newest first."""

    items: list[MemoryView]


class Erased(BaseModel):
    """What an erasure request deleted."""

    user: str
    deleted: int


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
    )


@router.get("", response_model=MemoryPage)
def list_memory(
    grant: Authenticated,
    request: Request,
    kind: MemoryKind | None = None,
    user: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> MemoryPage:
    """The tenant's facts and episodes (of ``kind``; in ``user``'s own scope), newest first."""
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
    """Delete everything in ``user``'s own scope of the tenant (an erasure request)."""
    tenant = need(grant, KeyScope.CONTROL)
    return Erased(user=user, deleted=front_of(request).memory.erase_user(tenant, user))
