"""The Redis backend: the fleet's store (redis-py with hiredis), on one Redis node, a
Sentinel-managed one, or a Redis Cluster.

The key layout is :mod:`store.redis_keys`: a trajectory's snapshot and chain and its bucket of
the tenant's index and owing set share one hash tag, so a commit is one ``EVALSHA`` of
``lua/cas.lua`` over four keys of one slot. Listings merge the tenant's buckets. Transient
errors are retried; a commit whose reply was lost is resolved by reading its commit id back,
and one still unresolved raises :class:`StoreUnavailable` naming its commit id. Design:
``docs/adr/0014-redis-store.md``, ``docs/adr/0170-store-on-redis-cluster.md``.

A retire (:meth:`RedisStore.retire`) is ``lua/retire.lua`` on the trajectory's two keys, then
``lua/unindex.lua`` on its index and owing buckets (the same slot), two calls that are each
safe to send again; a retire cut off between them leaves an index entry the next sweep drops.
"""

from __future__ import annotations

import builtins
import heapq
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import redis
from redis.exceptions import NoScriptError, RedisError

from kernel.chain import ChainRow
from kernel.errors import (
    ConfigError,
    CorruptSnapshot,
    SnapshotNotFound,
    StoreError,
    StoreUnavailable,
)
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import LifecycleState
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
    retirable,
    settle,
)
from store.redis_client import (
    TRANSIENT,
    client_for,
    is_cluster,
    retry_transient,
    script_reply,
    text,
)
from store.redis_direct import direct_batch, direct_command
from store.redis_index import IndexPager
from store.redis_keys import (
    COMMITS_KEPT,
    bucket_of,
    commit_keys,
    enc,
    index_keys,
    owing_keys,
    snapshot_pattern,
    trajectory_of_snapshot,
)
from store.redis_layout import check_layout
from store.scripts import scripts_beside

_T = TypeVar("_T")

# The index score of each state. Fixed here, never derived from the enum's order: a stored
# index must keep its meaning when the enum changes. A state missing here fails at import.
STATE_CODES: dict[LifecycleState, int] = {
    LifecycleState.READY: 1,
    LifecycleState.CALLING_MODEL: 2,
    LifecycleState.WAITING_TOOL: 3,
    LifecycleState.AWAITING_APPROVAL: 4,
    LifecycleState.PAUSED: 5,
    LifecycleState.FINALIZING: 6,
    LifecycleState.COMPLETED: 7,
    LifecycleState.FAILED: 8,
    LifecycleState.CANCELED: 9,
}
if set(STATE_CODES) != set(LifecycleState):
    raise RuntimeError("store.redis_store.STATE_CODES needs a code for every LifecycleState")
_CODE_OF = {state.value: code for state, code in STATE_CODES.items()}
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


SCRIPTS = scripts_beside(__file__)


class TrajectoryKeys(NamedTuple):
    """The keys that hold one trajectory: its snapshot and its chain."""

    snapshot: str
    chain: str


class CommitMark(NamedTuple):
    """Where a script behind a commit finds that it applied: the snapshot key, the field of its
    version, and the commit id that field holds once it did (cas.lua)."""

    key: str
    field: str
    commit_id: str


class RedisStore(TrajectoryStore):
    """The store on Redis (a node or a cluster); see the module docstring for keys, atomicity
    and retries."""

    def __init__(self, client: redis.Redis, *, prefix: str = "reins", retry_attempts: int = 5):
        if not _PREFIX_RE.match(prefix):
            raise ConfigError(f"REINS_KEY_PREFIX: {prefix!r} may hold only A-Z a-z 0-9 _ . : -")
        if retry_attempts < 1:
            raise ConfigError("REINS_REDIS_RETRY_ATTEMPTS: must be at least 1")
        self.prefix = prefix
        self._client = client
        self._cluster = is_cluster(client)
        self._attempts = retry_attempts
        self._cas = SCRIPTS("cas.lua")
        self._execute = direct_command(client)  # the hot path: CAS and load, nothing else
        self._layout_checked = False
        self._retire = SCRIPTS("retire.lua")
        self._unindex = SCRIPTS("unindex.lua")
        self._pager = IndexPager(client, self._read)

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisStore:
        """The store at ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``."""
        return cls(
            client_for(settings),
            prefix=settings.key_prefix,
            retry_attempts=settings.redis_retry_attempts,
        )

    def check_layout(self) -> None:
        """Refuse a store written in an older key layout with :class:`UnsupportedLayout`
        (:func:`store.redis_layout.check_layout`). Done before this store's first read or
        commit; a transient error leaves it to the next one (whose own call then fails and
        says what)."""
        try:
            check_layout(self._client, self.prefix)
        except TRANSIENT:
            return
        except RedisError as exc:
            raise StoreError(f"checking the store's key layout: {exc}") from exc
        self._layout_checked = True

    # --- keys ------------------------------------------------------------------------------

    def trajectory_keys(self, tenant: str, trajectory_id: str) -> TrajectoryKeys:
        """The snapshot and chain keys of one trajectory (one hash tag)."""
        keys = commit_keys(self.prefix, tenant, trajectory_id)
        return TrajectoryKeys(keys.snapshot, keys.chain)

    def index_keys(self, tenant: str) -> tuple[str, ...]:
        """Every bucket of the tenant's state index, in bucket order."""
        return index_keys(self.prefix, tenant)

    def index_key_for(self, tenant: str, trajectory_id: str) -> str:
        """The bucket of the tenant's state index that lists ``trajectory_id`` (whose keys
        share its slot)."""
        return commit_keys(self.prefix, tenant, trajectory_id)[2]

    def owing_keys(self, tenant: str) -> tuple[str, ...]:
        """Every bucket of the tenant's owing set, in bucket order."""
        return owing_keys(self.prefix, tenant)

    def ledger_key(self, tenant: str, key: str) -> str:
        """Where the result recorded under an idempotency key lives."""
        return f"{{{self.prefix}:{enc(tenant)}:{enc(key)}}}:idem"

    # --- retries ---------------------------------------------------------------------------

    def _retrying(self, what: str, fn: Callable[[], _T], *, first_failed: bool = False) -> _T:
        """Run ``fn``, retrying transient errors within the bounded attempts.

        ``first_failed``: the caller's first attempt already failed, so one fewer remains.
        """
        attempts = self._attempts - 1 if first_failed else self._attempts
        if attempts < 1:
            raise StoreUnavailable(f"{what}: Redis unreachable after {self._attempts} attempts")
        return retry_transient(fn, what=what, attempts=attempts, counted=self._attempts)

    def _read(self, what: str, fn: Callable[[], _T]) -> _T:
        """A read: one plain try on the hot path, then bounded retries."""
        if not self._layout_checked:
            self.check_layout()
        try:
            return fn()
        except TRANSIENT:
            return self._retrying(what, fn, first_failed=True)
        except RedisError as exc:
            raise StoreError(f"{what}: {exc}") from exc

    # --- snapshots -------------------------------------------------------------------------

    def apply(
        self,
        commit: Commit,
        before: Sequence[tuple[Any, ...]] = (),
        after: Sequence[tuple[Any, ...]] = (),
        replies: list[Any] | None = None,
    ) -> int:
        """One EVALSHA of cas.lua; a lost reply is resolved by commit id (module docstring).

        ``before``: commands the server runs first (idempotent ones: they are sent again with
        a commit that must be sent again). A worker that admits a turn itself writes its
        holding this way (:mod:`worker.follow_on`): it is in place before the admission is. On
        one node they share the commit's round trip (an error reply of one is raised, though
        the commit after it ran); on a cluster their keys are in other slots, so each is sent,
        and answered, before the commit is (an error reply of one is raised, and no commit is
        sent). ``after``: on one node, commands sent in the same round trip behind the commit,
        which the server runs whatever the commit's outcome; their replies (an error reply in
        its place) go to ``replies``, also when the commit lost. On a cluster, or once the round
        trip failed, they are not sent (again) and ``replies`` stays empty: the caller sends
        them itself if they are still wanted."""
        if not self._layout_checked:
            self.check_layout()
        snap_key, chain_key, index_key, owing_key = commit_keys(
            self.prefix, commit.tenant, commit.trajectory_id
        )
        call: tuple[bytes | str | int, ...] = (
            snap_key,
            chain_key,
            index_key,
            owing_key,
            commit.expected_version,
            commit.version,
            _CODE_OF[commit.state],
            commit.snapshot,
            commit.commit_id,
            commit.trajectory_id,
            1 if commit.owes else 0,
            COMMITS_KEPT,
        )
        if commit.rows:
            call = (*call, commit.first_row, *commit.rows)
        try:
            reply = self._run_cas(call, before, after, replies)
        except TRANSIENT:
            if replies:  # the replies of a round trip whose end was lost: none is known
                replies.clear()
            what = (
                f"trajectory {commit.trajectory_id}: commit {commit.commit_id} "
                f"(version {commit.version}) has an unknown outcome"
            )
            reply = self._retrying(
                what, lambda: self._read_back(commit, snap_key, call, before), first_failed=True
            )
        except RedisError as exc:
            raise StoreError(f"committing trajectory {commit.trajectory_id}: {exc}") from exc
        if reply[0] > 0:  # applied, or a repeat of this very commit
            return commit.version
        return settle(commit, CommitOutcome(reply[0]), reply[1])

    def commit_mark(self, commit: Commit) -> CommitMark:
        """Where a script behind ``commit`` finds that it applied: the snapshot key, the field
        of its version and the commit id that field holds once it did (cas.lua)."""
        snap_key = commit_keys(self.prefix, commit.tenant, commit.trajectory_id)[0]
        return CommitMark(snap_key, f"c{commit.version}", commit.commit_id)

    def _run_cas(
        self,
        call: Sequence[bytes | str | int],
        before: Sequence[tuple[Any, ...]] = (),
        after: Sequence[tuple[Any, ...]] = (),
        replies: list[Any] | None = None,
    ) -> list[int]:
        """EVALSHA cas.lua with 4 keys (between ``before`` and ``after``, in one round trip on
        one node), loading the script once more if the server lost it."""
        if self._cluster:  # other slots: each in place before the commit is sent
            for command in before:
                self._execute(*command)
            before = after = ()
        if before or after:
            batch = direct_batch(self._client)
            for command in before:
                batch.execute_command(*command)
            batch.execute_command("EVALSHA", self._cas.sha, 4, *call)
            for command in after:
                batch.execute_command(*command)
            got = batch.execute(raise_on_error=False)
            if replies is not None:
                replies.extend(got[len(before) + 1 :])
            for reply_ in got[: len(before)]:
                if isinstance(reply_, Exception):
                    raise reply_
            return cast(list[int], script_reply(got[len(before)], lambda: self._run_cas(call)))
        try:
            reply: list[int] = self._execute("EVALSHA", self._cas.sha, 4, *call)
        except NoScriptError:
            self._cas.load(self._client)
            reply = self._execute("EVALSHA", self._cas.sha, 4, *call)
        return reply

    def _read_back(
        self,
        commit: Commit,
        snap_key: str,
        call: Sequence[bytes | str | int],
        before: Sequence[tuple[Any, ...]] = (),
    ) -> list[int]:
        """After a lost reply: find out whether the commit landed, and finish it if not."""
        stored_id, current = self._client.hmget(snap_key, [f"c{commit.version}", "v"])
        if stored_id is not None and text(stored_id) == commit.commit_id:
            return [CommitOutcome.REPEAT, commit.version]
        current_version = int(text(current)) if current is not None else 0
        if current_version != commit.expected_version:
            return [CommitOutcome.CONFLICT, current_version]
        # Not applied (or still in flight on the dead connection): the script's own commit-id
        # check makes sending it again safe whichever of the two arrives first.
        return self._run_cas(call, before)

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        """The stored snapshot, validated; see :meth:`SnapshotStore.load`."""
        snap_key = self.trajectory_keys(tenant, trajectory_id)[0]
        version, data = self._read(
            f"loading trajectory {trajectory_id}",
            lambda: self._execute("HMGET", snap_key, "v", "data"),
        )
        if data is None:
            raise SnapshotNotFound(f"trajectory {trajectory_id} not found in tenant {tenant}")
        try:
            stored_version = int(text(version))
        except ValueError:
            raise CorruptSnapshot(
                f"trajectory {trajectory_id} in tenant {tenant}: stored version {version!r}"
            ) from None
        return decode_snapshot(tenant, trajectory_id, stored_version, data)

    def _each_bucket(
        self, what: str, keys: Sequence[str], command: Callable[[str], tuple[Any, ...]]
    ) -> builtins.list[Any]:
        """``command(key)`` for every key, sent together (grouped by node on a cluster); the
        replies in key order."""

        def send() -> builtins.list[Any]:
            batch = direct_batch(self._client)
            for key in keys:
                batch.execute_command(*command(key))
            return batch.execute()

        return self._read(what, send)

    @staticmethod
    def _range(state: LifecycleState | None) -> tuple[int | str, int | str]:
        return ("-inf", "+inf") if state is None else (STATE_CODES[state],) * 2

    def list(self, tenant: str, state: LifecycleState | None = None) -> builtins.list[str]:
        """Ids from every bucket of the tenant's index (one score range per state), sorted."""
        low, high = self._range(state)
        replies = self._each_bucket(
            f"listing tenant {tenant}",
            self.index_keys(tenant),
            lambda key: ("ZRANGEBYSCORE", key, low, high),
        )
        return sorted(text(m) for members in replies for m in members)

    def page(
        self, tenant: str, state: LifecycleState, after: str, limit: int
    ) -> builtins.list[str]:
        """The index's order is by bucket, then by id (:mod:`store.redis_index`): the rest of
        ``after``'s bucket, then the buckets past it, ``lua/index_page.lua`` on each."""
        what = f"paging tenant {tenant}"
        return self._pager.page(self.index_keys(tenant), what, STATE_CODES[state], after, limit)

    def count(self, tenant: str, state: LifecycleState | None = None) -> int:
        """``ZCOUNT`` over every bucket of the tenant's index: no ids are read."""
        low, high = self._range(state)
        sizes = self._each_bucket(
            f"counting tenant {tenant}",
            self.index_keys(tenant),
            lambda key: ("ZCOUNT", key, low, high),
        )
        return sum(int(size) for size in sizes)

    def owing(self, tenant: str, limit: int = 1000) -> builtins.list[str]:
        """The first ``limit`` ids, in id order, of the owing buckets merged (each bucket is in
        id order, score 0, so ``limit`` from each is enough)."""
        replies = self._each_bucket(
            f"listing what tenant {tenant} owes",
            self.owing_keys(tenant),
            lambda key: ("ZRANGE", key, 0, limit - 1),
        )
        merged = heapq.merge(*([text(m) for m in members] for members in replies))
        return [tid for tid, _ in zip(merged, range(limit), strict=False)]

    def committed(self, tenant: str, trajectory_id: str, version: int) -> str | None:
        """The commit id stored for ``version``, or None; only the last
        :data:`~store.redis_keys.COMMITS_KEPT` versions keep theirs (cas.lua trims the rest)."""
        snap_key = self.trajectory_keys(tenant, trajectory_id)[0]
        stored = self._read(
            f"reading commits of trajectory {trajectory_id}",
            lambda: self._client.hget(snap_key, f"c{version}"),
        )
        return None if stored is None else text(stored)

    def retire(self, tenant: str, trajectory_id: str, expected_version: int) -> Retirement:
        """Two calls on the trajectory's slot: retire.lua deletes the snapshot and chain (if
        still at ``expected_version`` and ended), then unindex.lua removes its index and owing
        entries.

        Whether the run owes is read from the record at that version (the version pins its
        content), so the owing set, kept by every commit, holds no entry for it. An
        interrupted retire leaves the index entry alone; the next retire of the id finds no
        snapshot and removes it (``GONE``). Both scripts are safe to send again.
        """
        snap_key, chain_key = self.trajectory_keys(tenant, trajectory_id)
        try:
            record = self.load(tenant, trajectory_id)
        except SnapshotNotFound:
            self._drop_entry(tenant, trajectory_id)
            return Retirement.GONE
        if record.record_version != expected_version:
            return Retirement.CHANGED
        if not retirable(record):
            return Retirement.KEPT
        outcome, _ = self._retrying(
            f"retiring trajectory {trajectory_id}",
            lambda: self._retire.run(self._client, [snap_key, chain_key], [expected_version]),
        )
        if outcome < 0:
            return Retirement.CHANGED
        self._drop_entry(tenant, trajectory_id)
        return Retirement.RETIRED if outcome > 0 else Retirement.GONE

    def _drop_entry(self, tenant: str, trajectory_id: str) -> None:
        """The second call of a retire: unindex.lua on the trajectory's index and owing
        buckets. A retired run owed nothing, so an owing entry is there only if a commit's
        owing write was ever cut off from the commit: it names a trajectory that is gone."""
        _, _, index_key, owing_key = commit_keys(self.prefix, tenant, trajectory_id)
        self._retrying(
            f"removing trajectory {trajectory_id} from the index",
            lambda: self._unindex.run(self._client, [index_key, owing_key], [trajectory_id]),
        )

    def owing_key_for(self, tenant: str, trajectory_id: str) -> str:
        """The bucket of the tenant's owing set that would list ``trajectory_id``."""
        return commit_keys(self.prefix, tenant, trajectory_id)[3]

    def rebuild_index(self, tenant: str) -> int:
        """Rebuild the tenant's state index from its snapshots; return how many it lists.

        A repair tool (the index is derived): run it when the tenant's trajectories are quiet,
        since a commit that lands during the scan may be indexed under its older state. Each
        bucket is replaced in one transaction of its own slot.
        """
        pattern = snapshot_pattern(self.prefix, tenant)

        def rebuild() -> int:
            buckets: dict[int, dict[str, int]] = {}
            for key in self._client.scan_iter(match=pattern, count=1000):
                code = self._client.hget(key, "s")
                if code is not None:
                    tid = trajectory_of_snapshot(text(key))
                    buckets.setdefault(bucket_of(tid), {})[tid] = int(text(code))
            for bucket, key in enumerate(self.index_keys(tenant)):
                pipe = self._client.pipeline(transaction=True)
                pipe.delete(key)
                if buckets.get(bucket):
                    pipe.zadd(key, buckets[bucket])
                pipe.execute()
            return sum(len(members) for members in buckets.values())

        if not self._layout_checked:
            self.check_layout()
        return self._retrying(f"rebuilding the index of tenant {tenant}", rebuild)

    # --- chain and ledger ------------------------------------------------------------------

    def read(self, tenant: str, trajectory_id: str, start: int = 0) -> builtins.list[ChainRow]:
        """Chain rows from ``start`` on."""
        chain_key = self.trajectory_keys(tenant, trajectory_id)[1]
        rows = self._read(
            f"reading the chain of trajectory {trajectory_id}",
            lambda: self._client.lrange(chain_key, start, -1),
        )
        return [decode_row(trajectory_id, row) for row in rows]

    def last_row(self, tenant: str, trajectory_id: str) -> ChainRow | None:
        """``LINDEX -1``: the last row alone."""
        chain_key = self.trajectory_keys(tenant, trajectory_id)[1]
        row = self._read(
            f"reading the chain of trajectory {trajectory_id}",
            lambda: self._client.lindex(chain_key, -1),
        )
        return None if row is None else decode_row(trajectory_id, row)

    def record(self, tenant: str, key: str, result: JsonObject) -> JsonObject:
        """``SET NX GET``: first write wins, a repeat (or a retry) gets the stored result."""
        data = encode_result(key, result)
        ledger_key = self.ledger_key(tenant, key)
        previous = self._read(
            f"recording idempotency key {key}",
            lambda: self._client.set(ledger_key, data, nx=True, get=True),
        )
        return decode_result(data if previous is None else text(previous))

    def lookup(self, tenant: str, key: str) -> JsonObject | None:
        """The stored result, or None."""
        ledger_key = self.ledger_key(tenant, key)
        stored = self._read(
            f"looking up idempotency key {key}", lambda: self._client.get(ledger_key)
        )
        return None if stored is None else decode_result(stored)

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()
