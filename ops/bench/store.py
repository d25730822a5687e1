"""``reins bench store``: a commit (the store's compare-and-set) against a raw ``SET``.

Side by side on the Redis of ``REINS_REDIS_URL``, the ``SET`` sent on the commit's own path
(each thread's pinned connection, one command a round trip), so the ratio compares what the
server does for each and not two clients; Redis's own CPU for each, from ``INFO commandstats``;
the embedded SQLite store beside them. With ``--cluster``, on a three-master Redis Cluster the
bench starts itself (:mod:`ops.local.cluster`), through a ``RedisCluster`` client. The fields
and the method are described in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from decimal import Decimal
from functools import partial
from pathlib import Path

import redis

from kernel.budget import Budget
from kernel.chain import ChainRow, RowKind
from kernel.record import PlanStep, TrajectoryRecord
from kernel.settings import Settings
from kernel.states import LifecycleState
from ops.bench.commandstats import ServerTime, tally
from ops.bench.peers import Peer, installed
from ops.bench.store_paging import paging_figures
from ops.local.cluster import LocalCluster
from store.base import Commit, TrajectoryStore, prepare_commit
from store.redis_client import client_from_url, is_cluster
from store.redis_direct import direct_command
from store.redis_keys import COMMITS_KEPT
from store.redis_store import RedisStore
from store.sqlite import SqliteStore

TENANT = "bench"


def peer(cluster: bool = False) -> Peer:
    """The raw ``SET``: sent as a commit's ``EVALSHA`` is, one a round trip on the same path."""
    where = (
        "straight to the slot's master on its pooled connection"
        if cluster
        else "on the thread's pinned connection"
    )
    return Peer(
        name="redis-py SET",
        version=installed("redis"),
        path=f"store.redis_direct.direct_command, the commit's own path: {where}, one command "
        f"a round trip as the commit, hiredis {installed('hiredis')}",
    )


def _record(tid: str) -> TrajectoryRecord:
    """A mid-sized record: a plan, a few facts, an observation (about 1.6 kB of JSON)."""
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant=TENANT,
        user="cu_bench",
        goal="refund order ord_1001 if it arrived damaged and is within the refund window",
        agent="examples.support:refund_agent",
        budget=Budget.build(max_cost=Decimal("2.50"), max_steps=40),
        now=0.0,
    )
    rec.plan = [PlanStep(id=f"s{i}", tool=f"tool_{i}") for i in range(4)]
    rec.facts = {f"ord_1001.field_{i}": i for i in range(8)}
    rec.last_observation = {"status": "ok", "order": {"id": "ord_1001", "total_cents": 4200}}
    return rec


def _row(rec: TrajectoryRecord, index: int) -> ChainRow:
    return ChainRow(
        trajectory_id=rec.trajectory_id,
        tenant=rec.tenant,
        user=rec.user,
        index=index,
        step=index,
        kind=RowKind.MODEL,
        record_version=rec.record_version,
        at=float(index),
        call_id=f"call-{index}",
        outcome="tool_proposal",
        tokens_in=812,
        tokens_out=64,
    )


def _commits(tid: str, count: int, rows: bool) -> tuple[list[Commit], float]:
    """The create and then ``count`` successive commits of one trajectory; seconds per commit."""
    rec = _record(tid)
    states = (LifecycleState.CALLING_MODEL, LifecycleState.READY)
    commits = [prepare_commit(rec, 0)]
    spent = 0.0
    for v in range(1, count + 1):
        nxt = rec.model_copy(update={"record_version": v + 1, "state": states[v % 2]})
        chain = [_row(nxt, v - 1)] if rows else []
        started = time.perf_counter()
        commits.append(prepare_commit(nxt, v, chain))
        spent += time.perf_counter() - started
    return commits, spent / count


def _loop(fn: Callable[[], object], times: int) -> Callable[[], None]:
    def body() -> None:
        for _ in range(times):
            fn()

    return body


def _apply_all(store: TrajectoryStore, commits: Sequence[Commit]) -> Callable[[], None]:
    def body() -> None:
        for commit in commits:
            store.apply(commit)

    return body


class _Crew:
    """``size`` threads kept for one concurrency level, as a worker keeps its threads: each
    keeps the connection the direct path pinned to it, so a SET and a commit of one thread go
    over the same connection and no timed phase pays for connecting. A phase starts them all
    from one line; its time runs until the last one is done."""

    def __init__(self, size: int) -> None:
        self._start = threading.Barrier(size + 1)
        self._done = threading.Barrier(size + 1)
        self._work: Sequence[Callable[[], None]] = ()
        self._failed: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def _serve(self, i: int) -> None:
        while True:
            self._start.wait()
            if not self._work:  # closed
                return
            try:
                self._work[i]()
            except BaseException as exc:  # handed to the phase's caller
                self._failed.append(exc)
            self._done.wait()

    def run(self, work: Sequence[Callable[[], None]]) -> float:
        """Run ``work[i]`` on thread i, all from one start line; the wall time in seconds."""
        self._work = work
        self._start.wait()
        started = time.perf_counter()
        self._done.wait()
        elapsed = time.perf_counter() - started
        if self._failed:
            raise self._failed[0]
        return elapsed

    def close(self) -> None:
        """End the threads."""
        self._work = ()
        self._start.wait()
        for thread in self._threads:
            thread.join()


#: The phases of a round, in order, and the command of each whose server time is read (the
#: pooled SET's is the raw SET's: the same command, sent another way).
_PHASES: dict[str, str | None] = {
    "pool_set": None,
    "raw_set": "set",
    "cas": "evalsha",
    "cas_row": "evalsha",
}


def _redis_figures(
    store: RedisStore, client: redis.Redis, prefix: str, threads: int, ops: int, rounds: int
) -> tuple[dict[str, object], float]:
    """Figures at one concurrency, and the mean serialise seconds per commit.

    Each thread owns two trajectories (commits without and with a chain row) and a raw key.
    The run is many short rounds, each a phase of every kind in turn (:data:`_PHASES`), so
    that noise from a shared machine falls on all alike.
    """
    run = uuid.uuid4().hex[:8]
    total = ops * rounds
    made = [_commits(f"c{threads}-{run}-{i}", total, False) for i in range(threads)]
    plain = [commits for commits, _ in made]
    rowed = [_commits(f"c{threads}-{run}-{i}-row", total, True)[0] for i in range(threads)]
    direct = direct_command(client)  # the path store.apply sends its EVALSHA on
    sets = [(f"{{{prefix}:raw:{i}}}", plain[i][1].snapshot) for i in range(threads)]
    seconds = dict.fromkeys(_PHASES, 0.0)
    server = {kind: ServerTime() for kind, command in _PHASES.items() if command}
    crew = _Crew(threads)
    try:
        # Not timed: the creates, and a first SET each way, so every connection is open.
        crew.run(
            [
                _all(
                    partial(store.apply, plain[i][0]),
                    partial(store.apply, rowed[i][0]),
                    partial(direct, "SET", *sets[i]),
                    partial(client.set, *sets[i]),
                )
                for i in range(threads)
            ]
        )
        for r in range(rounds):
            part = slice(1 + r * ops, 1 + (r + 1) * ops)
            work = {
                "pool_set": [_loop(partial(client.set, *kv), ops) for kv in sets],
                "raw_set": [_loop(partial(direct, "SET", *kv), ops) for kv in sets],
                "cas": [_apply_all(store, commits[part]) for commits in plain],
                "cas_row": [_apply_all(store, commits[part]) for commits in rowed],
            }
            for kind, command in _PHASES.items():
                if command is None:
                    seconds[kind] += crew.run(work[kind])
                    continue
                before = tally(client, command)
                seconds[kind] += crew.run(work[kind])
                server[kind].add(before, tally(client, command), threads * ops)
    finally:
        crew.close()
    done = threads * total
    figures: dict[str, object] = {f"c{threads}_ops": done}
    for kind, spent in seconds.items():
        figures[f"c{threads}_{kind}_per_s"] = round(done / spent)
    figures[f"c{threads}_ratio"] = round(seconds["raw_set"] / seconds["cas"], 3)
    figures.update(_server_figures(f"c{threads}", server))
    return figures, sum(spent for _, spent in made) / threads


def _server_figures(label: str, server: dict[str, ServerTime]) -> dict[str, object]:
    """Redis's microseconds per SET, per commit and per commit with a row, and a commit's over
    a SET's; windows another client's same command ran in are left out and counted."""
    per = {kind: spent.us_per_call() for kind, spent in server.items()}
    set_us, cas_us = per["raw_set"], per["cas"]
    return {
        f"{label}_redis_us_per_set": set_us,
        f"{label}_redis_us_per_cas": cas_us,
        f"{label}_redis_us_per_cas_row": per["cas_row"],
        f"{label}_redis_cas_over_set": (
            round(cas_us / set_us, 2) if cas_us is not None and set_us else None
        ),
        f"{label}_redis_windows_left_out": sum(spent.left_out for spent in server.values()),
    }


def _all(*steps: Callable[[], object]) -> Callable[[], None]:
    def body() -> None:
        for step in steps:
            step()

    return body


def _sqlite_per_s(ops: int) -> float:
    with tempfile.TemporaryDirectory(prefix="reins-bench-") as tmp:
        store = SqliteStore(os.path.join(tmp, "bench.db"))
        commits, _ = _commits("sqlite", ops, rows=False)
        store.apply(commits[0])
        started = time.perf_counter()
        _apply_all(store, commits[1:])()
        elapsed = time.perf_counter() - started
        store.close()
    return ops / elapsed


#: A finished trajectory for the memory figures: versions committed, one chain row each.
MEMORY_VERSIONS = 60


def _memory_figures(store: RedisStore, client: redis.Redis) -> dict[str, object]:
    """``MEMORY USAGE`` of a finished trajectory's keys (snapshot and chain, plus its entry in
    the index bucket, from the bucket's usage with and without it), as this build leaves them
    and with every version's commit id kept, as the build before trimming did."""
    tid = f"memory-{uuid.uuid4().hex[:8]}"
    commits, _ = _commits(tid, MEMORY_VERSIONS, rows=True)
    final = _record(tid).model_copy(
        update={"record_version": MEMORY_VERSIONS + 2, "state": LifecycleState.COMPLETED}
    )
    commits.append(prepare_commit(final, MEMORY_VERSIONS + 1))
    for commit in commits:
        store.apply(commit)
    snap_key, chain_key = store.trajectory_keys(TENANT, tid)
    index_key = store.index_key_for(TENANT, tid)

    def usage(key: str) -> int:
        return int(client.memory_usage(key, samples=0) or 0)

    with_entry = usage(index_key)
    client.zrem(index_key, tid)
    entry = with_entry - usage(index_key) if client.exists(index_key) else with_entry
    client.zadd(index_key, {tid: 7})
    snapshot, rest = usage(snap_key), usage(chain_key) + entry
    versions = MEMORY_VERSIONS + 2
    dropped = range(1, versions - COMMITS_KEPT + 1)
    client.hset(snap_key, mapping={f"c{v}": commits[-1].commit_id for v in dropped})
    untrimmed = usage(snap_key)
    return {
        "memory_versions": versions,
        "memory_finished_bytes": snapshot + rest,
        "memory_finished_untrimmed_bytes": untrimmed + rest,
        "memory_snapshot_bytes": snapshot,
        "memory_snapshot_untrimmed_bytes": untrimmed,
    }


def _server_version(client: redis.Redis) -> str:
    info = client.info("server")
    if is_cluster(client) and "redis_version" not in info:  # one answer per node
        info = next(iter(info.values()))
    return str(info["redis_version"])


def run(quick: bool = False, cluster: bool = False) -> dict[str, object]:
    """Measure and return one JSON-ready object (see the module docstring)."""
    settings = Settings.from_env(os.environ)
    prefix = f"{settings.key_prefix}-bench-{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        url = settings.redis_url
        if cluster:
            own = LocalCluster(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            own.start()
            stack.callback(own.stop)
            url = own.url
        client = client_from_url(url)
        store = RedisStore(client, prefix=prefix, retry_attempts=settings.redis_retry_attempts)
        stack.callback(store.close)
        if not cluster:  # the machine's Redis: leave nothing behind
            stack.callback(_delete_prefix, client, prefix)
        return _measure(store, client, quick, "cluster-3" if cluster else "single")
    raise AssertionError("unreachable")  # pragma: no cover - the with block returns


def _delete_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{{{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def _measure(
    store: RedisStore, client: redis.Redis, quick: bool, topology: str
) -> dict[str, object]:
    rounds = 4 if quick else 40
    result: dict[str, object] = {
        "peer": peer(cluster=topology != "single").as_json(),
        "redis_version": _server_version(client),
        "redis_cpu_from": "INFO commandstats usec of set and evalsha, differenced per phase",
        "topology": topology,
        "rounds": rounds,
    }
    serialise: list[float] = []
    for threads, ops in ((1, 50 if quick else 250), (16, 5 if quick else 25)):
        figures, spent = _redis_figures(store, client, store.prefix, threads, ops, rounds)
        result.update(figures)
        result["payload_bytes"] = len(_record(f"c{threads}-00000000-0").to_json())
        serialise.append(spent)
    result["serialise_us"] = round(1e6 * sum(serialise) / len(serialise), 1)
    result.update(_memory_figures(store, client))
    result["sqlite_cas_per_s"] = round(_sqlite_per_s(100 if quick else 1000))
    result.update(paging_figures(store, client, quick))
    return result
