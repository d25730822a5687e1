"""Helpers shared by the store tests, and a worker process that advances one trajectory.

Run as ``python -m tests.contract.advance_worker SPEC TENANT TID TIMES WRITER``: it opens the
store named by SPEC (``sqlite:<path>`` or ``redis:<url>|<prefix>``), prints ``ready``, waits
for one line on stdin (the common start line), advances the trajectory TIMES times retrying
each lost race, and prints one JSON line with its counts.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Any

from kernel.amounts import Amounts
from kernel.budget import Budget
from kernel.chain import ChainRow, RowKind
from kernel.errors import ConcurrentModification
from kernel.record import Operation, OpKind, OpStatus, SettlementOwner, TrajectoryRecord
from kernel.states import LifecycleState
from store.base import TrajectoryStore


def make_record(tid: str = "t1", tenant: str = "acme") -> TrajectoryRecord:
    """A small record at version 1 in READY."""
    return TrajectoryRecord.create(
        trajectory_id=tid,
        tenant=tenant,
        user="cu_ana",
        goal="refund ord_1001",
        agent="m:a",
        budget=Budget.build(max_cost=Decimal("2.50")),
        now=0.0,
    )


def next_version(
    rec: TrajectoryRecord, state: LifecycleState | None = None, step: int = 1
) -> TrajectoryRecord:
    """The record advanced by ``step`` versions (and moved to ``state`` when given)."""
    update: dict[str, Any] = {"record_version": rec.record_version + step}
    if state is not None:
        update["state"] = state
    return rec.model_copy(update=update)


def with_open_call(rec: TrajectoryRecord, status: OpStatus) -> TrajectoryRecord:
    """``rec`` holding one tool call in ``status``, owned by the reconciler."""
    op = Operation(
        op_id="c1",
        call_id="c1",
        kind=OpKind.TOOL,
        attempts=["c1/a1"],
        idempotency_key="k1",
        epoch=0,
        reservation=Amounts.of(tool_calls=1),
        settlement_owner=SettlementOwner.RECONCILER,
        status=status,
    )
    return rec.model_copy(update={"operations": {"c1": op}})


def row_for(rec: TrajectoryRecord, index: int, writer: str = "") -> ChainRow:
    """A chain row committed with ``rec``'s version."""
    return ChainRow(
        trajectory_id=rec.trajectory_id,
        tenant=rec.tenant,
        user=rec.user,
        index=index,
        step=index,
        kind=RowKind.MODEL,
        record_version=rec.record_version,
        at=float(index),
        detail={"writer": writer} if writer else None,
    )


def advance(
    store: TrajectoryStore, tenant: str, tid: str, times: int, writer: str
) -> dict[str, int]:
    """Advance a trajectory ``times`` times by compare-and-set, each with one chain row.

    Every lost race must raise :class:`ConcurrentModification` naming a newer version than
    the one this writer expected; the counts say how many times each happened.
    """
    wins = conflicts = stale_reports = 0
    for _ in range(times):
        while True:
            current = store.load(tenant, tid)
            nxt = next_version(current)
            row = row_for(nxt, current.record_version - 1, writer)
            try:
                store.compare_and_set(nxt, current.record_version, [row])
            except ConcurrentModification as exc:
                conflicts += 1
                if exc.current_version > exc.expected_version == current.record_version:
                    stale_reports += 1
                continue
            wins += 1
            break
    return {"wins": wins, "conflicts": conflicts, "stale_reports": stale_reports}


def open_store(spec: str) -> TrajectoryStore:
    """The store a SPEC names: ``sqlite:<path>`` or ``redis:<url>|<prefix>``."""
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        from store.sqlite import SqliteStore

        return SqliteStore(rest)
    if kind == "redis":
        from store.redis_client import client_from_url
        from store.redis_store import RedisStore

        url, _, prefix = rest.rpartition("|")
        return RedisStore(client_from_url(url), prefix=prefix)
    raise ValueError(f"unknown store spec {spec!r}")


def main(argv: list[str]) -> int:
    spec, tenant, tid, times, writer = argv
    store = open_store(spec)
    print("ready", flush=True)
    sys.stdin.readline()
    counts = advance(store, tenant, tid, int(times), writer)
    store.close()
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
