"""The store's seams: snapshot store, execution chain, idempotency ledger, and their contracts.

Every backend (Redis for the fleet, SQLite embedded, in-memory for tests) subclasses
:class:`TrajectoryStore`; the contract suite in ``tests/contract`` runs against each. A write is
:func:`prepare_commit` (pure: checks and serialises, refusing bad input before anything is
touched) then the backend's atomic :meth:`~SnapshotStore.apply`. A commit whose id is already
stored at its target version is a repeat: it reports success and writes nothing, so a retry
after a lost reply is safe. Design: ``docs/adr/0013-store-seams.md``.
"""

from __future__ import annotations

import abc
import builtins
import itertools
import json
import logging
import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple

from pydantic import ValidationError

from kernel.chain import ChainRow
from kernel.errors import (
    ConcurrentModification,
    CorruptSnapshot,
    InvalidInput,
    SnapshotExists,
    SnapshotNotFound,
    UnsupportedSchema,
)
from kernel.modeljson import model_json
from kernel.record import TrajectoryRecord
from kernel.states import TERMINAL, LifecycleState

JsonObject = dict[str, Any]
log = logging.getLogger("reins.store")


class Commit(NamedTuple):
    """One checked, serialised commit, ready for a backend to apply atomically."""

    tenant: str
    trajectory_id: str
    expected_version: int  # 0 for a create
    version: int  # the version the snapshot is committed as
    state: str
    snapshot: bytes
    rows: tuple[bytes, ...]  # chain rows, serialised, in chain order
    first_row: int  # chain index of rows[0]; meaningful only when rows is not empty
    commit_id: str
    owes: bool = False  # ended with an operation still open: listed by ``owing``


class TrajectoryKey(NamedTuple):
    """Where a trajectory is: its tenant and its id (ids are unique within a tenant)."""

    tenant: str
    trajectory_id: str


class CommitOutcome(IntEnum):
    """What a backend's atomic step found; :func:`settle` turns it into a result or an error."""

    CHAIN_GAP = -1  # the version matched but rows[0] is not the next chain index
    CONFLICT = 0  # the stored version is not the expected one (0 when there is none)
    APPLIED = 1
    REPEAT = 2  # this commit id is already stored at this version: applied before


class _CommitIds:
    """Unique commit ids without a system call each: 64 random bits drawn once per process
    (again in a forked child, which would otherwise repeat its parent's ids) and a counter."""

    def __init__(self) -> None:
        self.draw()
        os.register_at_fork(after_in_child=self.draw)

    def draw(self) -> None:
        """A fresh random prefix and counter."""
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()  # next() on it is atomic: threads share it safely

    def next(self) -> str:
        """The prefix and the next count: 32 hex digits."""
        return f"{self.prefix}{next(self.counter):016x}"


_COMMIT_IDS: _CommitIds | None = None


def new_commit_id() -> str:
    """A fresh, unique commit id (32 hex digits): two processes share a prefix with
    probability 2**-64, and one process never repeats a count. Reading ``os.urandom`` for every
    commit showed on the commit path."""
    global _COMMIT_IDS
    if _COMMIT_IDS is None:  # on first use, not at import
        _COMMIT_IDS = _CommitIds()
    return _COMMIT_IDS.next()


def prepare_commit(
    record: TrajectoryRecord,
    expected_version: int,
    chain_rows: Sequence[ChainRow] = (),
    commit_id: str | None = None,
) -> Commit:
    """Check a commit and serialise it; raise :class:`InvalidInput` for anything malformed.

    The new version must be above the expected one; every row must belong to the record's
    trajectory and tenant and carry a version above the expected one and at most the new one,
    never lower than the row before it (several steps committed as one: each row keeps the
    version its step made), and the rows' indexes must be consecutive.
    """
    tid, tenant, version = record.trajectory_id, record.tenant, record.record_version
    if not tid or not tenant:
        raise InvalidInput("a trajectory record needs a non-empty trajectory_id and tenant")
    if expected_version < 0 or version <= expected_version:
        raise InvalidInput(
            f"trajectory {tid}: record_version {version} must be above the "
            f"expected version {expected_version}"
        )
    if commit_id is not None and not commit_id:
        raise InvalidInput(f"trajectory {tid}: an empty commit id")
    first = chain_rows[0].index if chain_rows else 0
    lowest = expected_version + 1
    for offset, row in enumerate(chain_rows):
        if row.trajectory_id != tid or row.tenant != tenant:
            raise InvalidInput(
                f"trajectory {tid}: chain row {row.index} belongs to trajectory "
                f"{row.trajectory_id} of tenant {row.tenant}"
            )
        if not lowest <= row.record_version <= version:
            raise InvalidInput(
                f"trajectory {tid}: chain row {row.index} carries version {row.record_version}, "
                f"the commit writes versions {lowest} to {version}"
            )
        lowest = row.record_version
        if row.index != first + offset:
            raise InvalidInput(f"trajectory {tid}: chain row indexes are not consecutive")
    return Commit(
        tenant,
        tid,
        expected_version,
        version,
        record.state.value,
        record.to_json(),
        tuple(map(model_json, chain_rows)),  # exactly pydantic's bytes
        first,
        commit_id or new_commit_id(),
        record.state in TERMINAL and bool(record.open_operations),
    )


_SUCCEEDED = (CommitOutcome.APPLIED, CommitOutcome.REPEAT)


class Retirement(StrEnum):
    """What :meth:`SnapshotStore.retire` found, and so did."""

    RETIRED = "retired"  # deleted: record, chain, commit ids, index and owing entries
    CHANGED = "changed"  # the stored version is not the expected one (a commit won): kept
    KEPT = "kept"  # at that version but live, or ended still owing a settlement: kept
    GONE = "gone"  # nothing stored (any index entry left behind by a retire is removed)


def retirable(record: TrajectoryRecord) -> bool:
    """True when ``record`` may be retired: it ended and owes nothing (no operation left
    open for the reconciler to settle)."""
    return record.state in TERMINAL and not record.open_operations


def settle(commit: Commit, outcome: CommitOutcome, found: int) -> int:
    """Turn a backend's outcome into the new version, or the error that names what was found."""
    if outcome in _SUCCEEDED:
        return commit.version
    tid = commit.trajectory_id
    if outcome is CommitOutcome.CHAIN_GAP:
        raise InvalidInput(
            f"trajectory {tid}: chain rows start at index {commit.first_row} but the chain "
            f"holds {found} rows; nothing was written"
        )
    if commit.expected_version == 0:
        raise SnapshotExists(tid, found)
    if found == 0:
        raise SnapshotNotFound(f"trajectory {tid} not found in tenant {commit.tenant}")
    if found < commit.expected_version:  # versions only grow: the store lost commits
        log.error(
            "trajectory %s of tenant %s is stored at version %d, below the version %d its "
            "writer saw committed: the store lost acknowledged writes (a Redis failover to a "
            "replica behind its primary, or a restart without the AOF); the sweeps recover it",
            tid,
            commit.tenant,
            found,
            commit.expected_version,
        )
    raise ConcurrentModification(tid, commit.expected_version, found)


def decode_snapshot(
    tenant: str, trajectory_id: str, version: int, data: bytes | str
) -> TrajectoryRecord:
    """Parse a stored snapshot, or raise an error naming the trajectory; never repairs it.

    Raises :class:`UnsupportedSchema` for an unknown schema version and :class:`CorruptSnapshot`
    for anything else that does not validate, including a snapshot whose tenant, id or version
    disagree with where and how it is stored.
    """
    where = f"trajectory {trajectory_id} in tenant {tenant}"
    try:
        record = TrajectoryRecord.from_json(data)
    except UnsupportedSchema as exc:
        raw = json.loads(data)  # from_json parsed it, so this cannot fail
        if not _has_schema_version(raw):
            raise CorruptSnapshot(f"{where}: stored snapshot has no schema_version") from None
        raise _unsupported(where, exc) from None
    except (ValidationError, ValueError):
        record = None  # say precisely what is wrong, below
    if record is None:
        record = _parse_or_explain(where, data)
    if (record.tenant, record.trajectory_id) != (tenant, trajectory_id):
        raise CorruptSnapshot(
            f"{where}: stored snapshot names trajectory {record.trajectory_id} "
            f"of tenant {record.tenant}"
        )
    if record.record_version != version:
        raise CorruptSnapshot(
            f"{where}: stored at version {version} but the snapshot says {record.record_version}"
        )
    return record


def _parse_or_explain(where: str, data: bytes | str) -> TrajectoryRecord:
    """Parse a snapshot that did not validate at the first try, raising the error that says
    precisely what is wrong with it."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise CorruptSnapshot(f"{where}: stored snapshot is not JSON ({exc})") from None
    if not _has_schema_version(raw):
        raise CorruptSnapshot(f"{where}: stored snapshot has no schema_version")
    try:
        return TrajectoryRecord.from_json(data)
    except UnsupportedSchema as exc:
        raise _unsupported(where, exc) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise CorruptSnapshot(
            f"{where}: stored snapshot does not validate ({field}: {first['msg']})"
        ) from None


def _has_schema_version(raw: object) -> bool:
    return isinstance(raw, dict) and isinstance(raw.get("schema_version"), int)


def _unsupported(where: str, exc: UnsupportedSchema) -> UnsupportedSchema:
    detail = str(exc).split(": ", 1)[-1]
    return UnsupportedSchema(f"{where}: {detail}; the snapshot is left as is")


def decode_row(trajectory_id: str, data: bytes | str) -> ChainRow:
    """Parse one stored chain row, or raise :class:`CorruptSnapshot` naming the trajectory."""
    try:
        return ChainRow.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptSnapshot(f"trajectory {trajectory_id}: a chain row does not validate") from exc


def encode_result(key: str, result: JsonObject) -> bytes:
    """Serialise an idempotency result; refuse one that is not plain JSON."""
    try:
        return json.dumps(result, sort_keys=True, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"idempotency key {key}: result is not JSON ({exc})") from None


def decode_result(data: bytes | str) -> JsonObject:
    """Parse a stored idempotency result."""
    value: JsonObject = json.loads(data)
    return value


class SnapshotStore(abc.ABC):
    """Trajectory snapshots under optimistic concurrency, scoped by tenant.

    A snapshot is addressed by (tenant, trajectory_id): the same id in another tenant is
    another trajectory, and a load, list or commit never sees across tenants.
    """

    def create(self, record: TrajectoryRecord, *, commit_id: str | None = None) -> int:
        """Store a new trajectory at ``record.record_version``; return that version.

        Atomic like :meth:`compare_and_set` from version 0. Raises :class:`SnapshotExists`
        (a :class:`ConcurrentModification`) when the tenant already holds that id; nothing
        is written then.
        """
        return self.apply(prepare_commit(record, 0, (), commit_id))

    def compare_and_set(
        self,
        record: TrajectoryRecord,
        expected_version: int,
        chain_rows: Sequence[ChainRow] = (),
        commit_id: str | None = None,
    ) -> int:
        """Commit ``record`` if the stored version is still ``expected_version``.

        Atomic, all or nothing: the check, the snapshot write, the append of ``chain_rows``
        to the execution chain and the tenant/state index update happen together or not at
        all. Succeeds only if the stored version equals ``expected_version`` and
        ``record.record_version`` is above it; returns the new version. Otherwise raises
        :class:`ConcurrentModification` naming the stored version (the loser knows it lost),
        or :class:`SnapshotNotFound` when there is no such trajectory. A repeat of a commit
        already applied under the same ``commit_id`` returns the version and writes nothing.
        """
        return self.apply(prepare_commit(record, expected_version, chain_rows, commit_id))

    @abc.abstractmethod
    def apply(self, commit: Commit) -> int:
        """Carry out a prepared commit atomically (the contract of :meth:`compare_and_set`)."""

    @abc.abstractmethod
    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        """The stored snapshot; reads only, never writes.

        Raises :class:`SnapshotNotFound` when this tenant holds no such trajectory (including
        when another tenant does), :class:`UnsupportedSchema` for an unknown schema version
        and :class:`CorruptSnapshot` for a snapshot that fails validation; each names the
        trajectory, and the stored snapshot is left exactly as it was.
        """

    @abc.abstractmethod
    def list(self, tenant: str, state: LifecycleState | None = None) -> builtins.list[str]:
        """Ids of the tenant's trajectories (in ``state`` when given), sorted; from the index."""

    def page(
        self, tenant: str, state: LifecycleState, after: str, limit: int
    ) -> builtins.list[str]:
        """Up to ``limit`` ids of the tenant's trajectories in ``state`` that come after the id
        ``after`` ("" for the first) in the index's own order, a fixed order of ids that each
        backend states; a page shorter than ``limit`` is the last. A walk continues each page
        after the last id of the one before, so an id in ``state`` all through the walk is
        returned exactly once, whatever is added or removed meanwhile. The stores for scale
        (Redis, SQLite) answer with work bounded by ``limit``, not by how far into the index
        the page starts; this default, in id order, lists the state to find its place."""
        ids = self.list(tenant, state)
        start = bisect_right(ids, after) if after else 0
        return ids[start : start + limit]

    def count(self, tenant: str, state: LifecycleState | None = None) -> int:
        """How many trajectories the tenant has (in ``state``); a backend answers from its
        index without listing them (a submission checks its tenant's backlog this way)."""
        return len(self.list(tenant, state))

    def records(
        self, tenant: str, state: LifecycleState | None = None
    ) -> Iterator[TrajectoryRecord]:
        """Every stored record of ``tenant`` (in ``state``), loaded one at a time."""
        for trajectory_id in self.list(tenant, state):
            yield self.load(tenant, trajectory_id)

    @abc.abstractmethod
    def owing(self, tenant: str, limit: int = 1000) -> builtins.list[str]:
        """Up to ``limit`` ids, sorted, of the tenant's ended trajectories that still owe a
        settlement (an operation left open, which the reconciler owns); kept by every commit,
        atomically with it, so no such trajectory is ever out of the reconciler's sight."""

    @abc.abstractmethod
    def retire(self, tenant: str, trajectory_id: str, expected_version: int) -> Retirement:
        """Delete one finished trajectory: its snapshot, commit ids, chain and index and
        owing entries, if it is still stored at ``expected_version`` and :func:`retirable` there.

        Compare-and-delete: a commit that lands first wins (``CHANGED``, nothing deleted), and
        one that comes after finds no trajectory (:class:`SnapshotNotFound`). A live run or one
        that still owes is ``KEPT``. Every backend removes the stored trajectory atomically;
        one whose index lives apart from it (Redis) removes the index entry afterwards, so an
        interrupted retire leaves an index entry without a trajectory, which the next
        ``retire`` of that id (``GONE``) removes. Idempotency-ledger results are not the
        trajectory's and stay.
        """

    @abc.abstractmethod
    def committed(self, tenant: str, trajectory_id: str, version: int) -> str | None:
        """The commit id stored for ``version``, or None: resolves a commit of unknown outcome.
        A backend may keep only the latest versions' ids (Redis keeps 8): enough for that, as
        a writer resolves its commit before it writes anything newer."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; the store is not used afterwards."""


class ExecutionChain(abc.ABC):
    """The append-only execution chain of each trajectory: what happened, in order.

    Rows are appended only by :meth:`SnapshotStore.compare_and_set`, in the same atomic step
    as the snapshot they belong to, so a row exists if and only if its version was committed.
    No row is ever updated or deleted (until :meth:`SnapshotStore.retire` deletes the whole
    chain with its trajectory); indexes run from 0 without gaps. A row is identified by
    (tenant, trajectory_id, index) and joins with traces by ``trajectory_id`` and ``call_id``.
    """

    @abc.abstractmethod
    def read(self, tenant: str, trajectory_id: str, start: int = 0) -> builtins.list[ChainRow]:
        """The rows from index ``start`` on, in chain order; empty for an unknown trajectory."""

    def last_row(self, tenant: str, trajectory_id: str) -> ChainRow | None:
        """The chain's last row (its time is when the trajectory last moved), or None for an
        empty chain or an unknown trajectory; a backend reads only that row."""
        rows = self.read(tenant, trajectory_id)
        return rows[-1] if rows else None


class IdempotencyLedger(abc.ABC):
    """The recorded result of each effect, by tenant and idempotency key.

    :meth:`record` is atomic and first-write-wins: the first result stored under a key stays,
    and every later call (a retry, a duplicate delivery) gets that stored result back.
    """

    @abc.abstractmethod
    def record(self, tenant: str, key: str, result: JsonObject) -> JsonObject:
        """Store ``result`` under ``key`` unless one is stored; return the stored result."""

    @abc.abstractmethod
    def lookup(self, tenant: str, key: str) -> JsonObject | None:
        """The result stored under ``key``, or None."""


class TrajectoryStore(SnapshotStore, ExecutionChain, IdempotencyLedger):
    """What one backend provides: snapshots, their chains and the idempotency ledger."""
