"""The in-process backend: the contract of :mod:`store.base` behind one lock, for unit tests.

It keeps serialised bytes, not live objects, so a caller can never change a stored snapshot by
mutating a record it holds, and a load validates exactly as the durable backends do.
"""

from __future__ import annotations

import builtins
import threading
from dataclasses import dataclass, field

from kernel.chain import ChainRow
from kernel.errors import SnapshotNotFound
from kernel.record import TrajectoryRecord
from kernel.states import TERMINAL, LifecycleState
from store.base import (
    Commit,
    CommitOutcome,
    JsonObject,
    Retirement,
    TrajectoryKey,
    TrajectoryStore,
    decode_result,
    decode_row,
    decode_snapshot,
    encode_result,
    settle,
)

Address = TrajectoryKey
_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)


@dataclass(slots=True)
class _Trajectory:
    """Everything stored for one trajectory."""

    version: int = 0
    state: str = ""
    snapshot: bytes = b""
    commits: dict[int, str] = field(default_factory=dict)
    chain: builtins.list[bytes] = field(default_factory=list)


class InProcessStore(TrajectoryStore):
    """Snapshots, chains, the state index and the ledger in dicts; every method under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trajectories: dict[Address, _Trajectory] = {}
        self._index: dict[str, dict[str, set[str]]] = {}  # tenant -> state -> ids
        self._owing: dict[str, set[str]] = {}  # tenant -> ids of ended runs that still owe
        self._ledger: dict[tuple[str, str], bytes] = {}  # (tenant, idempotency key) -> result

    def apply(self, commit: Commit) -> int:
        """Check and write under the lock; see :meth:`SnapshotStore.compare_and_set`."""
        tenant, tid, expected, version, _, _, rows, first_row, commit_id, _ = commit
        address = TrajectoryKey(tenant, tid)
        with self._lock:
            trajectory = self._trajectories.get(address)
            if trajectory is None:
                trajectory = _Trajectory()
            if trajectory.commits.get(version) == commit_id:
                outcome, found = CommitOutcome.REPEAT, version
            elif trajectory.version != expected:
                outcome, found = CommitOutcome.CONFLICT, trajectory.version
            elif rows and len(trajectory.chain) != first_row:
                outcome, found = CommitOutcome.CHAIN_GAP, len(trajectory.chain)
            else:
                self._write(address, trajectory, commit)
                return version
        return settle(commit, outcome, found)

    def _write(self, address: Address, trajectory: _Trajectory, commit: Commit) -> None:
        """The write half of :meth:`apply`, under its lock."""
        tenant, tid, _, version, state, snapshot, rows, _, commit_id, owes = commit
        if trajectory.state != state:  # the index moves only when the state does
            states = self._index.get(tenant)
            if states is None:
                states = self._index[tenant] = {}
            if trajectory.state:
                states[trajectory.state].discard(tid)
            ids = states.get(state)
            if ids is None:
                ids = states[state] = set()
            ids.add(tid)
        if owes:
            self._owing.setdefault(tenant, set()).add(tid)
        elif tenant in self._owing:
            self._owing[tenant].discard(tid)
        trajectory.chain.extend(rows)
        trajectory.commits[version] = commit_id
        trajectory.version, trajectory.state, trajectory.snapshot = version, state, snapshot
        self._trajectories[address] = trajectory

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        """The stored snapshot, validated; see :meth:`SnapshotStore.load`."""
        with self._lock:
            trajectory = self._trajectories.get(TrajectoryKey(tenant, trajectory_id))
            stored = (trajectory.version, trajectory.snapshot) if trajectory else None
        if stored is None:
            raise SnapshotNotFound(f"trajectory {trajectory_id} not found in tenant {tenant}")
        return decode_snapshot(tenant, trajectory_id, *stored)

    def list(self, tenant: str, state: LifecycleState | None = None) -> builtins.list[str]:
        """Ids from the tenant/state index, sorted."""
        with self._lock:
            states = self._index.get(tenant, {})
            if state is not None:
                return sorted(states.get(state.value, ()))
            return sorted(tid for ids in states.values() for tid in ids)

    def count(self, tenant: str, state: LifecycleState | None = None) -> int:
        """The size of the tenant/state index."""
        with self._lock:
            states = self._index.get(tenant, {})
            if state is not None:
                return len(states.get(state.value, ()))
            return sum(len(ids) for ids in states.values())

    def owing(self, tenant: str, limit: int = 1000) -> builtins.list[str]:
        """Ids of the tenant's ended runs that still owe, sorted; at most ``limit``."""
        with self._lock:
            return sorted(self._owing.get(tenant, ()))[:limit]

    def retire(self, tenant: str, trajectory_id: str, expected_version: int) -> Retirement:
        """Compare-and-delete under the lock; see :meth:`SnapshotStore.retire`."""
        with self._lock:
            trajectory = self._trajectories.get(TrajectoryKey(tenant, trajectory_id))
            if trajectory is None:
                return Retirement.GONE
            if trajectory.version != expected_version:
                return Retirement.CHANGED
            owes = trajectory_id in self._owing.get(tenant, ())
            if trajectory.state not in _TERMINAL_NAMES or owes:
                return Retirement.KEPT
            del self._trajectories[TrajectoryKey(tenant, trajectory_id)]
            self._index[tenant][trajectory.state].discard(trajectory_id)
        return Retirement.RETIRED

    def committed(self, tenant: str, trajectory_id: str, version: int) -> str | None:
        """The commit id stored for ``version``, or None."""
        with self._lock:
            trajectory = self._trajectories.get(TrajectoryKey(tenant, trajectory_id))
            return trajectory.commits.get(version) if trajectory else None

    def read(self, tenant: str, trajectory_id: str, start: int = 0) -> builtins.list[ChainRow]:
        """Chain rows from ``start`` on."""
        with self._lock:
            trajectory = self._trajectories.get(TrajectoryKey(tenant, trajectory_id))
            rows = trajectory.chain[start:] if trajectory else []
        return [decode_row(trajectory_id, row) for row in rows]

    def record(self, tenant: str, key: str, result: JsonObject) -> JsonObject:
        """First write wins; return the stored result."""
        data = encode_result(key, result)
        with self._lock:
            stored = self._ledger.setdefault((tenant, key), data)
        return decode_result(stored)

    def lookup(self, tenant: str, key: str) -> JsonObject | None:
        """The stored result, or None."""
        with self._lock:
            stored = self._ledger.get((tenant, key))
        return None if stored is None else decode_result(stored)

    def close(self) -> None:
        """Nothing to release."""
