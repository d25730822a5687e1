"""The SQLite backend: the embedded default, one file (``./.reins/reins.db`` unless configured).

Tables, each keyed by tenant first: ``snapshots(tenant, trajectory_id, version, state, data)``
(its index ``snapshots_by_state`` is the tenant/state index), ``commits(tenant, trajectory_id,
version, commit_id)``, ``chain(tenant, trajectory_id, idx, data)`` and ``idempotency(tenant,
key, result)``. A commit is one ``BEGIN IMMEDIATE`` transaction (WAL, ``synchronous=FULL``);
anything short of success rolls back. Each thread gets its own connection; processes may share
the file if each opens the store after forking. Design: ``docs/adr/0015-sqlite-store.md``.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernel.chain import ChainRow
from kernel.errors import ConfigError, SnapshotNotFound, StoreError, StoreUnavailable
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import TERMINAL, LifecycleState
from store.base import (
    Commit,
    CommitOutcome,
    JsonObject,
    Retirement,
    TrajectoryStore,
    decode_result,
    decode_row,
    decode_snapshot,
    encode_result,
    settle,
)

_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS snapshots (
    tenant TEXT NOT NULL,
    trajectory_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (tenant, trajectory_id)
);
CREATE INDEX IF NOT EXISTS snapshots_by_state ON snapshots (tenant, state, trajectory_id);
CREATE TABLE IF NOT EXISTS owing (
    tenant TEXT NOT NULL,
    trajectory_id TEXT NOT NULL,
    PRIMARY KEY (tenant, trajectory_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS commits (
    tenant TEXT NOT NULL,
    trajectory_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    commit_id TEXT NOT NULL,
    PRIMARY KEY (tenant, trajectory_id, version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chain (
    tenant TEXT NOT NULL,
    trajectory_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (tenant, trajectory_id, idx)
);
CREATE TABLE IF NOT EXISTS idempotency (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    result BLOB NOT NULL,
    PRIMARY KEY (tenant, key)
);
COMMIT;
"""


class SqliteFile:
    """One SQLite file opened per thread (WAL, ``synchronous=FULL``), its schema created at
    open; errors turned into the reins tree. What every SQLite-backed store shares."""

    def __init__(
        self, path: str | os.PathLike[str], schema: str, *, busy_timeout_s: float = 30.0
    ) -> None:
        self.path = Path(path)
        if str(path) in ("", ":memory:"):
            raise ConfigError("REINS_SQLITE_PATH: the SQLite store needs a file path")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        with self._errors(f"opening {self.path}"):
            self._conn().executescript(schema)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path,
                timeout=self._busy_timeout_s,
                isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
                check_same_thread=False,  # only so close() may close it from another thread
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Turn sqlite3 errors into the reins tree, naming what was being done."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise StoreUnavailable(f"{what}: SQLite stayed busy ({exc})") from exc
            raise StoreError(f"{what}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{what}: {exc}") from exc

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction: committed on a normal exit, else rolled back."""
        conn = self._conn()
        with self._errors(what):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                if conn.in_transaction:  # the body may have rolled back on purpose
                    conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close every connection this store opened, in any thread."""
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()


class SqliteStore(SqliteFile, TrajectoryStore):
    """The store in one SQLite file; safe across threads and processes on one machine."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> None:
        super().__init__(path, _SCHEMA, busy_timeout_s=busy_timeout_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> SqliteStore:
        """The store at ``settings.sqlite_path`` (``REINS_SQLITE_PATH``)."""
        return cls(settings.sqlite_path)

    def apply(self, commit: Commit) -> int:
        """One transaction; see :meth:`SnapshotStore.compare_and_set`."""
        with self._write(f"committing trajectory {commit.trajectory_id}") as conn:
            outcome, found = self._apply_in(conn, commit)
            if outcome is not CommitOutcome.APPLIED:
                conn.execute("ROLLBACK")
        return settle(commit, outcome, found)

    def _apply_in(self, conn: sqlite3.Connection, commit: Commit) -> tuple[CommitOutcome, int]:
        where = (commit.tenant, commit.trajectory_id)
        seen = conn.execute(
            "SELECT commit_id FROM commits WHERE tenant = ? AND trajectory_id = ? AND version = ?",
            (*where, commit.version),
        ).fetchone()
        if seen is not None and seen[0] == commit.commit_id:
            return CommitOutcome.REPEAT, commit.version
        if commit.expected_version == 0:
            changed = conn.execute(
                "INSERT INTO snapshots (tenant, trajectory_id, version, state, data) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (*where, commit.version, commit.state, commit.snapshot),
            ).rowcount
        else:
            changed = conn.execute(
                "UPDATE snapshots SET version = ?, state = ?, data = ? "
                "WHERE tenant = ? AND trajectory_id = ? AND version = ?",
                (commit.version, commit.state, commit.snapshot, *where, commit.expected_version),
            ).rowcount
        if changed != 1:
            return CommitOutcome.CONFLICT, self._version(conn, *where)
        if commit.rows:
            length = conn.execute(
                "SELECT COALESCE(MAX(idx) + 1, 0) FROM chain "
                "WHERE tenant = ? AND trajectory_id = ?",
                where,
            ).fetchone()[0]
            if length != commit.first_row:
                return CommitOutcome.CHAIN_GAP, int(length)
            conn.executemany(
                "INSERT INTO chain (tenant, trajectory_id, idx, data) VALUES (?, ?, ?, ?)",
                [(*where, commit.first_row + i, row) for i, row in enumerate(commit.rows)],
            )
        conn.execute(
            "INSERT INTO commits (tenant, trajectory_id, version, commit_id) VALUES (?, ?, ?, ?)",
            (*where, commit.version, commit.commit_id),
        )
        if commit.owes:
            conn.execute("INSERT OR IGNORE INTO owing (tenant, trajectory_id) VALUES (?, ?)", where)
        elif commit.state in _TERMINAL_NAMES:  # only an ended run can have owed
            conn.execute("DELETE FROM owing WHERE tenant = ? AND trajectory_id = ?", where)
        return CommitOutcome.APPLIED, commit.version

    @staticmethod
    def _version(conn: sqlite3.Connection, tenant: str, trajectory_id: str) -> int:
        row = conn.execute(
            "SELECT version FROM snapshots WHERE tenant = ? AND trajectory_id = ?",
            (tenant, trajectory_id),
        ).fetchone()
        return 0 if row is None else int(row[0])

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        """The stored snapshot, validated; see :meth:`SnapshotStore.load`."""
        with self._errors(f"loading trajectory {trajectory_id}"):
            row = (
                self._conn()
                .execute(
                    "SELECT version, data FROM snapshots WHERE tenant = ? AND trajectory_id = ?",
                    (tenant, trajectory_id),
                )
                .fetchone()
            )
        if row is None:
            raise SnapshotNotFound(f"trajectory {trajectory_id} not found in tenant {tenant}")
        return decode_snapshot(tenant, trajectory_id, int(row[0]), bytes(row[1]))

    def list(self, tenant: str, state: LifecycleState | None = None) -> builtins.list[str]:
        """Ids from the (tenant, state) index, sorted."""
        sql, args = "SELECT trajectory_id FROM snapshots WHERE tenant = ?", [tenant]
        if state is not None:
            sql, args = sql + " AND state = ?", [tenant, state.value]
        with self._errors(f"listing tenant {tenant}"):
            rows = self._conn().execute(sql + " ORDER BY trajectory_id", args).fetchall()
        return [str(row[0]) for row in rows]

    def page(
        self, tenant: str, state: LifecycleState, after: str, limit: int
    ) -> builtins.list[str]:
        """The (tenant, state, id) index from just after ``after``, by id: one range seek."""
        sql = (
            "SELECT trajectory_id FROM snapshots WHERE tenant = ? AND state = ?"
            " AND trajectory_id > ? ORDER BY trajectory_id LIMIT ?"
        )
        with self._errors(f"paging tenant {tenant}"):
            rows = self._conn().execute(sql, [tenant, state.value, after, limit]).fetchall()
        return [str(row[0]) for row in rows]

    def count(self, tenant: str, state: LifecycleState | None = None) -> int:
        """COUNT over the (tenant, state) index."""
        sql, args = "SELECT COUNT(*) FROM snapshots WHERE tenant = ?", [tenant]
        if state is not None:
            sql, args = sql + " AND state = ?", [tenant, state.value]
        with self._errors(f"counting tenant {tenant}"):
            row = self._conn().execute(sql, args).fetchone()
        return int(row[0])

    def owing(self, tenant: str, limit: int = 1000) -> builtins.list[str]:
        """Ids from the ``owing`` table, sorted; at most ``limit``."""
        sql = "SELECT trajectory_id FROM owing WHERE tenant = ? ORDER BY trajectory_id LIMIT ?"
        with self._errors(f"listing what tenant {tenant} owes"):
            rows = self._conn().execute(sql, [tenant, limit]).fetchall()
        return [r[0] for r in rows]

    def retire(self, tenant: str, trajectory_id: str, expected_version: int) -> Retirement:
        """One transaction: check, then delete the snapshot, its commit ids and its chain; see
        :meth:`SnapshotStore.retire`."""
        where = (tenant, trajectory_id)
        with self._write(f"retiring trajectory {trajectory_id}") as conn:
            row = conn.execute(
                "SELECT version, state, EXISTS (SELECT 1 FROM owing "
                "WHERE tenant = ? AND trajectory_id = ?) "
                "FROM snapshots WHERE tenant = ? AND trajectory_id = ?",
                (*where, *where),
            ).fetchone()
            if row is None:
                found = Retirement.GONE
            elif int(row[0]) != expected_version:
                found = Retirement.CHANGED
            elif row[1] not in _TERMINAL_NAMES or row[2]:
                found = Retirement.KEPT
            else:
                for table in ("snapshots", "commits", "chain", "owing"):
                    conn.execute(
                        f"DELETE FROM {table} WHERE tenant = ? AND trajectory_id = ?",
                        where,
                    )
                found = Retirement.RETIRED
            if found is not Retirement.RETIRED:
                conn.execute("ROLLBACK")
        return found

    def last_row(self, tenant: str, trajectory_id: str) -> ChainRow | None:
        """The chain's row with the highest index, read alone."""
        with self._errors(f"reading the chain of trajectory {trajectory_id}"):
            row = (
                self._conn()
                .execute(
                    "SELECT data FROM chain WHERE tenant = ? AND trajectory_id = ? "
                    "ORDER BY idx DESC LIMIT 1",
                    (tenant, trajectory_id),
                )
                .fetchone()
            )
        return None if row is None else decode_row(trajectory_id, bytes(row[0]))

    def committed(self, tenant: str, trajectory_id: str, version: int) -> str | None:
        """The commit id stored for ``version``, or None."""
        with self._errors(f"reading commits of trajectory {trajectory_id}"):
            row = (
                self._conn()
                .execute(
                    "SELECT commit_id FROM commits "
                    "WHERE tenant = ? AND trajectory_id = ? AND version = ?",
                    (tenant, trajectory_id, version),
                )
                .fetchone()
            )
        return None if row is None else str(row[0])

    def read(self, tenant: str, trajectory_id: str, start: int = 0) -> builtins.list[ChainRow]:
        """Chain rows from ``start`` on."""
        with self._errors(f"reading the chain of trajectory {trajectory_id}"):
            rows = (
                self._conn()
                .execute(
                    "SELECT data FROM chain WHERE tenant = ? AND trajectory_id = ? AND idx >= ? "
                    "ORDER BY idx",
                    (tenant, trajectory_id, start),
                )
                .fetchall()
            )
        return [decode_row(trajectory_id, bytes(row[0])) for row in rows]

    def record(self, tenant: str, key: str, result: JsonObject) -> JsonObject:
        """First write wins; return the stored result."""
        data = encode_result(key, result)
        with self._write(f"recording idempotency key {key}") as conn:
            conn.execute(
                "INSERT INTO idempotency (tenant, key, result) VALUES (?, ?, ?) "
                "ON CONFLICT DO NOTHING",
                (tenant, key, data),
            )
            stored = conn.execute(
                "SELECT result FROM idempotency WHERE tenant = ? AND key = ?", (tenant, key)
            ).fetchone()[0]
        return decode_result(bytes(stored))

    def lookup(self, tenant: str, key: str) -> JsonObject | None:
        """The stored result, or None."""
        with self._errors(f"looking up idempotency key {key}"):
            row = (
                self._conn()
                .execute(
                    "SELECT result FROM idempotency WHERE tenant = ? AND key = ?", (tenant, key)
                )
                .fetchone()
            )
        return None if row is None else decode_result(bytes(row[0]))
