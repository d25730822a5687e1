"""The memory store's seam: semantic facts and episodes behind one contract.

Every backend (SQLite with an FTS5 index, Redis keyed under each owner's hash tag, and the
in-memory one for tests of the logic above it) subclasses :class:`MemoryBank`; the contract
suite in ``tests/contract/test_memory_contract.py`` runs against each, and compares every
recall with :func:`kernel.memory.recall`, the plain scan.

Contract:

* ``put`` writes one item atomically; an item with the same (kind, owner, key) is replaced,
  its old tags with it. It changes nothing else.
* ``recall`` reads only the rows of the caller's three owners: visibility is the query's own
  predicate, applied before anything is ranked or counted, never a filter on ranked rows.
* Every read and delete by id or by user is scoped by the tenant given, which comes from the
  credential: another tenant's ids are indistinguishable from ids that do not exist.
* An item is findable by each user it concerns (``MemoryItem.concerns``) and by each call its
  provenance names, from before it is readable until after it is deleted: an erasure or a
  removal by source never misses an item it would have found by a scan. ``erase_user`` and
  ``erase_source`` delete them in every index and return what they deleted.
* ``sweep`` deletes a tenant's items whose expiry has passed or that are older than the
  tenant's retention, at most ``limit`` of them a call; an item written again meanwhile (no
  longer due) is kept.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass

from kernel.errors import InvalidInput
from kernel.memory import MemoryItem, MemoryKind, Visibility, normal_tags, recall

MAX_RECALL = 100  # the most items one recall may ask for


def check_limit(limit: int) -> int:
    """Refuse a recall size outside 1..MAX_RECALL, naming it."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RECALL:
        raise InvalidInput(f"limit: {limit!r} is not a whole number in 1..{MAX_RECALL}")
    return limit


def newest_first(items: Iterable[MemoryItem]) -> list[MemoryItem]:
    """Items in listing order: newest first, then the highest id."""
    return sorted(items, key=lambda i: (i.written_ms, i.item_id), reverse=True)


def due(item: MemoryItem, now_ms: int, keep_ms: int | None) -> bool:
    """True when a sweep at ``now_ms`` deletes ``item``: its expiry has passed, or it was
    written ``keep_ms`` or more ago (None: no retention)."""
    if not item.live(now_ms):
        return True
    return keep_ms is not None and item.written_ms <= now_ms - keep_ms


@dataclass(frozen=True)
class Swept:
    """What one sweep deleted; ``more`` when it stopped at its limit (more may be due)."""

    deleted: int
    more: bool


class MemoryBank(abc.ABC):
    """Semantic facts and episodes for many tenants; see the module docstring."""

    @abc.abstractmethod
    def put(self, item: MemoryItem) -> None:
        """Write ``item``, replacing the item of the same id (and its tags) atomically."""

    def recall(
        self,
        visibility: Visibility,
        kind: MemoryKind,
        tags: Iterable[str],
        now_ms: int,
        limit: int = 10,
    ) -> list[MemoryItem]:
        """The live items of ``kind`` that ``visibility`` sees and that share a tag with
        ``tags``: most shared tags first, then the newest, then the highest id. Bad tags or a
        bad limit are refused before anything is read."""
        wanted = normal_tags(tags)
        check_limit(limit)
        return self._ranked(visibility, kind, wanted, now_ms, limit) if wanted else []

    @abc.abstractmethod
    def _ranked(
        self, vis: Visibility, kind: MemoryKind, wanted: tuple[str, ...], now_ms: int, limit: int
    ) -> list[MemoryItem]:
        """:meth:`recall` for checked, normalised, non-empty ``wanted`` tags."""

    @abc.abstractmethod
    def get(self, tenant: str, item_id: str) -> MemoryItem | None:
        """The item ``item_id`` of ``tenant``; None if ``tenant`` holds no such item."""

    def items(
        self, tenant: str, kind: MemoryKind | None = None, user: str | None = None
    ) -> list[MemoryItem]:
        """Every item of ``tenant`` (of ``kind``; that concerns ``user``), newest first."""
        found = self._tenant_items(tenant) if user is None else self.concerning(tenant, user)
        return newest_first(i for i in found if kind is None or i.kind is kind)

    @abc.abstractmethod
    def concerning(self, tenant: str, user: str) -> list[MemoryItem]:
        """Every item of ``tenant`` that concerns ``user`` (``MemoryItem.concerns_user``),
        through the index by user; newest first."""

    @abc.abstractmethod
    def from_source(self, tenant: str, call_id: str) -> list[MemoryItem]:
        """Every item of ``tenant`` whose provenance names the tool call ``call_id``."""

    @abc.abstractmethod
    def _tenant_items(self, tenant: str) -> Iterable[MemoryItem]:
        """Every item of ``tenant``, in any order."""

    @abc.abstractmethod
    def delete(self, tenant: str, item_id: str) -> bool:
        """Delete the item ``item_id`` of ``tenant``; False if ``tenant`` holds none."""

    def erase_user(self, tenant: str, user: str) -> list[MemoryItem]:
        """Delete every item that concerns ``user``, whatever its owner or kind (an erasure
        request), from every index; the items deleted."""
        return self._delete_all(tenant, self.concerning(tenant, user))

    def erase_source(self, tenant: str, call_id: str) -> list[MemoryItem]:
        """Delete every item whose provenance names the tool call ``call_id``; the items
        deleted."""
        return self._delete_all(tenant, self.from_source(tenant, call_id))

    def _delete_all(self, tenant: str, items: list[MemoryItem]) -> list[MemoryItem]:
        return [i for i in items if self.delete(tenant, i.item_id)]

    @abc.abstractmethod
    def sweep(self, tenant: str, now_ms: int, keep_ms: int | None, limit: int) -> Swept:
        """Delete up to ``limit`` of ``tenant``'s items that are :func:`due` at ``now_ms``."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections; the store is not used afterwards."""


class DictMemory(MemoryBank):
    """Memory in a dict: for tests of the logic above the store (same contract)."""

    def __init__(self) -> None:
        self._items: dict[str, MemoryItem] = {}

    def put(self, item: MemoryItem) -> None:
        """See :meth:`MemoryBank.put`."""
        self._items[item.item_id] = item

    def _ranked(
        self, vis: Visibility, kind: MemoryKind, wanted: tuple[str, ...], now_ms: int, limit: int
    ) -> list[MemoryItem]:
        return recall(self._tenant_items(vis.tenant), vis, kind, wanted, now_ms, limit)

    def get(self, tenant: str, item_id: str) -> MemoryItem | None:
        """See :meth:`MemoryBank.get`."""
        item = self._items.get(item_id)
        return item if item is not None and item.tenant == tenant else None

    def _tenant_items(self, tenant: str) -> list[MemoryItem]:
        return [i for i in self._items.values() if i.tenant == tenant]

    def concerning(self, tenant: str, user: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.concerning` (a scan: this is the reference)."""
        return newest_first(i for i in self._tenant_items(tenant) if i.concerns_user(user))

    def from_source(self, tenant: str, call_id: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.from_source`."""
        return newest_first(i for i in self._tenant_items(tenant) if call_id in i.call_ids)

    def delete(self, tenant: str, item_id: str) -> bool:
        """See :meth:`MemoryBank.delete`."""
        if self.get(tenant, item_id) is None:
            return False
        del self._items[item_id]
        return True

    def sweep(self, tenant: str, now_ms: int, keep_ms: int | None, limit: int) -> Swept:
        """See :meth:`MemoryBank.sweep`."""
        found = [i for i in self._tenant_items(tenant) if due(i, now_ms, keep_ms)]
        for item in found[:limit]:
            del self._items[item.item_id]
        return Swept(min(len(found), limit), len(found) > limit)
