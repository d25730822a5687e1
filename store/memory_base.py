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
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from kernel.errors import InvalidInput
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, normal_tags, recall

MAX_RECALL = 100  # the most items one recall may ask for


def check_limit(limit: int) -> int:
    """Refuse a recall size outside 1..MAX_RECALL, naming it."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_RECALL:
        raise InvalidInput(f"limit: {limit!r} is not a whole number in 1..{MAX_RECALL}")
    return limit


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
        """Every item of ``tenant`` (of ``kind``; in ``user``'s own scope), newest first."""
        found = [
            i
            for i in self._tenant_items(tenant)
            if (kind is None or i.kind is kind)
            and (user is None or (i.scope is Scope.USER and i.subject == user))
        ]
        return sorted(found, key=lambda i: (i.written_ms, i.item_id), reverse=True)

    @abc.abstractmethod
    def _tenant_items(self, tenant: str) -> Iterable[MemoryItem]:
        """Every item of ``tenant``, in any order."""

    @abc.abstractmethod
    def delete(self, tenant: str, item_id: str) -> bool:
        """Delete the item ``item_id`` of ``tenant``; False if ``tenant`` holds none."""

    def erase_user(self, tenant: str, user: str) -> int:
        """Delete every item in ``user``'s own scope (an erasure request); how many."""
        gone = 0
        for item in self.items(tenant, user=user):
            gone += self.delete(tenant, item.item_id)
        return gone

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

    def delete(self, tenant: str, item_id: str) -> bool:
        """See :meth:`MemoryBank.delete`."""
        if self.get(tenant, item_id) is None:
            return False
        del self._items[item_id]
        return True
