"""Memory in SQLite: the embedded default, in the same file as the embedded store.

``memory_items`` holds each item's JSON, keyed by tenant first; ``memory_terms`` is an FTS5
index over one column of opaque terms: the item's owner-and-kind term (``Owner.token`` with
the kind) and one term per tag. A recall is one statement whose FTS5 ``MATCH`` names the
caller's three owner terms beside each tag, so rows of any other owner never leave the index;
the overlap is the number of tag queries an item answers. ``memory_concerns`` and
``memory_sources`` index each item by the users it concerns and the calls its provenance
names. A write, a delete or a sweep's page is one ``BEGIN IMMEDIATE`` transaction over every
table. Design: ``docs/adr/0140-memory-tiers.md``, ``docs/adr/0142-memory-governance.md``.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable

from kernel.memory import MemoryItem, MemoryKind, Owner, Scope, Visibility, tag_token
from kernel.settings import Settings
from store.memory_base import MemoryBank, Swept, newest_first
from store.sqlite import SqliteFile

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS memory_items (
    tenant TEXT NOT NULL,
    item_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    scope TEXT NOT NULL,
    subject TEXT NOT NULL,
    written_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    terms TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS memory_by_id ON memory_items (tenant, item_id);
CREATE INDEX IF NOT EXISTS memory_by_time ON memory_items (tenant, written_ms);
CREATE INDEX IF NOT EXISTS memory_by_expiry ON memory_items (tenant, expires_ms);
CREATE INDEX IF NOT EXISTS memory_by_owner ON memory_items (tenant, scope, subject);
CREATE TABLE IF NOT EXISTS memory_concerns (
    tenant TEXT NOT NULL,
    user TEXT NOT NULL,
    item_id TEXT NOT NULL,
    PRIMARY KEY (tenant, user, item_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memory_concerns_by_item ON memory_concerns (tenant, item_id);
CREATE TABLE IF NOT EXISTS memory_sources (
    tenant TEXT NOT NULL,
    call_id TEXT NOT NULL,
    item_id TEXT NOT NULL,
    PRIMARY KEY (tenant, call_id, item_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memory_sources_by_item ON memory_sources (tenant, item_id);
CREATE VIRTUAL TABLE IF NOT EXISTS memory_terms USING fts5(
    terms, content='memory_items', content_rowid='rowid', detail=none
);
COMMIT;
"""


def owner_term(owner: Owner, kind: MemoryKind) -> str:
    """The index term of one owner's items of one kind."""
    return f"{owner.token}{kind.value[0]}"


def _terms(item: MemoryItem) -> str:
    return " ".join([owner_term(item.owner, item.kind), *(tag_token(t) for t in item.tags)])


class SqliteMemory(SqliteFile, MemoryBank):
    """Facts and episodes in one SQLite file; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(path, _SCHEMA, busy_timeout_s=busy_timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> SqliteMemory:
        """Memory in the embedded store's file (``REINS_SQLITE_PATH``)."""
        return cls(settings.sqlite_path)

    def put(self, item: MemoryItem) -> None:
        """See :meth:`MemoryBank.put`: the old row and its terms go in the same transaction."""
        self.put_many([item])

    def put_many(self, items: Iterable[MemoryItem]) -> None:
        """Write ``items`` in one transaction, each replacing the item of its id."""
        with self._write("writing memory items") as conn:
            for item in items:
                self._remove(conn, item.tenant, item.item_id)
                terms = _terms(item)
                cur = conn.execute(
                    "INSERT INTO memory_items (tenant, item_id, kind, scope, subject, "
                    "written_ms, expires_ms, terms, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        item.tenant,
                        item.item_id,
                        item.kind.value,
                        item.scope.value,
                        item.subject,
                        item.written_ms,
                        item.expires_ms,
                        terms,
                        item.model_dump_json(),
                    ),
                )
                conn.execute(
                    "INSERT INTO memory_terms (rowid, terms) VALUES (?, ?)", (cur.lastrowid, terms)
                )
                conn.executemany(
                    "INSERT INTO memory_concerns (tenant, user, item_id) VALUES (?, ?, ?)",
                    [(item.tenant, user, item.item_id) for user in item.concerns],
                )
                conn.executemany(
                    "INSERT INTO memory_sources (tenant, call_id, item_id) VALUES (?, ?, ?)",
                    [(item.tenant, call, item.item_id) for call in item.call_ids],
                )

    def _remove(self, conn: sqlite3.Connection, tenant: str, item_id: str) -> bool:
        row = conn.execute(
            "SELECT rowid, terms FROM memory_items WHERE tenant = ? AND item_id = ?",
            (tenant, item_id),
        ).fetchone()
        conn.execute(
            "DELETE FROM memory_concerns WHERE tenant = ? AND item_id = ?", (tenant, item_id)
        )
        conn.execute(
            "DELETE FROM memory_sources WHERE tenant = ? AND item_id = ?", (tenant, item_id)
        )
        if row is None:
            return False
        conn.execute(
            "INSERT INTO memory_terms (memory_terms, rowid, terms) VALUES ('delete', ?, ?)", row
        )
        conn.execute("DELETE FROM memory_items WHERE rowid = ?", (row[0],))
        return True

    def _ranked(
        self, vis: Visibility, kind: MemoryKind, wanted: tuple[str, ...], now_ms: int, limit: int
    ) -> list[MemoryItem]:
        """One statement, visibility inside every MATCH (the module docstring)."""
        owners = " OR ".join(owner_term(o, kind) for o in vis.owners())
        matches = [f"({owners}) AND {tag_token(t)}" for t in wanted]
        hits = " UNION ALL ".join(
            ["SELECT rowid FROM memory_terms WHERE memory_terms MATCH ?"] * len(matches)
        )
        sql = (
            f"SELECT m.data FROM ({hits}) AS h JOIN memory_items AS m ON m.rowid = h.rowid "
            "WHERE m.tenant = ? AND (m.expires_ms IS NULL OR m.expires_ms > ?) "
            "GROUP BY m.rowid ORDER BY COUNT(*) DESC, m.written_ms DESC, m.item_id DESC "
            "LIMIT ?"
        )
        with self._errors("recalling memory"):
            rows = self._conn().execute(sql, (*matches, vis.tenant, now_ms, limit))
            return [MemoryItem.model_validate_json(r[0]) for r in rows]

    def get(self, tenant: str, item_id: str) -> MemoryItem | None:
        """See :meth:`MemoryBank.get`."""
        with self._errors(f"reading memory item {item_id}"):
            row = (
                self._conn()
                .execute(
                    "SELECT data FROM memory_items WHERE tenant = ? AND item_id = ?",
                    (tenant, item_id),
                )
                .fetchone()
            )
        return None if row is None else MemoryItem.model_validate_json(row[0])

    def _tenant_items(self, tenant: str) -> list[MemoryItem]:
        with self._errors(f"listing memory of {tenant}"):
            rows = (
                self._conn()
                .execute("SELECT data FROM memory_items WHERE tenant = ?", (tenant,))
                .fetchall()
            )
        return [MemoryItem.model_validate_json(r[0]) for r in rows]

    def delete(self, tenant: str, item_id: str) -> bool:
        """See :meth:`MemoryBank.delete`."""
        with self._write(f"deleting memory item {item_id}") as conn:
            return self._remove(conn, tenant, item_id)

    def _select(self, what: str, sql: str, args: tuple[object, ...]) -> list[MemoryItem]:
        with self._errors(what):
            rows = self._conn().execute(sql, args).fetchall()
        return newest_first(MemoryItem.model_validate_json(r[0]) for r in rows)

    def concerning(self, tenant: str, user: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.concerning`: by the concerns index, and by the user's own
        scope (items written before ``concerns`` was recorded)."""
        return self._select(
            f"reading the memory of a user of {tenant}",
            "SELECT data FROM memory_items WHERE tenant = ? AND item_id IN "
            "(SELECT item_id FROM memory_concerns WHERE tenant = ? AND user = ?) "
            "UNION SELECT data FROM memory_items WHERE tenant = ? AND scope = ? AND subject = ?",
            (tenant, tenant, user, tenant, Scope.USER.value, user),
        )

    def from_source(self, tenant: str, call_id: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.from_source`."""
        return self._select(
            f"reading the memory call {call_id} wrote",
            "SELECT data FROM memory_items WHERE tenant = ? AND item_id IN "
            "(SELECT item_id FROM memory_sources WHERE tenant = ? AND call_id = ?)",
            (tenant, tenant, call_id),
        )

    def _delete_all(self, tenant: str, items: list[MemoryItem]) -> list[MemoryItem]:
        """Every item in one transaction (an erasure is all or nothing here)."""
        with self._write(f"deleting {len(items)} memory items") as conn:
            return [i for i in items if self._remove(conn, tenant, i.item_id)]

    def sweep(self, tenant: str, now_ms: int, keep_ms: int | None, limit: int) -> Swept:
        """See :meth:`MemoryBank.sweep`: the due ids read and deleted in one transaction."""
        cutoff = -1 if keep_ms is None else now_ms - keep_ms
        found: dict[str, None] = {}  # each range bounded by its own index and LIMIT
        with self._write(f"sweeping the memory of {tenant}") as conn:
            for column, bound in (("expires_ms", now_ms), ("written_ms", cutoff)):
                rows = conn.execute(
                    f"SELECT item_id FROM memory_items WHERE tenant = ? AND {column} <= ? LIMIT ?",
                    (tenant, bound, limit + 1),
                )
                found.update((r[0], None) for r in rows)
            due = list(found)
            for item_id in due[:limit]:
                self._remove(conn, tenant, item_id)
        return Swept(min(len(due), limit), len(due) > limit)

    def scan(self, tenant: str) -> list[tuple[str, int, str, str, int | None, str]]:
        """Every row of ``tenant`` as the brute-force peer of the benchmark reads it."""
        with self._errors("scanning memory"):
            return (
                self._conn()
                .execute(
                    "SELECT kind, written_ms, scope, subject, expires_ms, data "
                    "FROM memory_items WHERE tenant = ?",
                    (tenant,),
                )
                .fetchall()
            )
