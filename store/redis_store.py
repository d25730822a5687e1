"""The Redis backend: the fleet's store (redis-py with hiredis), on one Redis node.

``P`` is the key prefix; ``T``, ``I`` and ``K`` are the tenant, the trajectory id and an
idempotency key, each percent-encoded (all but ``A-Z a-z 0-9 _ . - ~``), so the layout is
injective and every key is scoped by tenant:

==========================  =====  ============================================================
``{P:T:I}:snap``            hash   ``v`` (version), ``s`` (state code, :data:`STATE_CODES`),
                                   ``data`` (the record's JSON), and ``c<version>`` -> commit
                                   id for every committed version
``{P:T:I}:chain``           list   execution chain rows (JSON); element n is chain index n
``{P:T}:index``             zset   each trajectory's snapshot key, scored by its state code;
                                   a state is one score range
``{P:T}:owing``             zset   ids of the tenant's ended runs that still owe a settlement
                                   (score 0, so read in id order)
``{P:T:K}:idem``            string the idempotency ledger's stored result (JSON)
==========================  =====  ============================================================

A retire (:meth:`RedisStore.retire`) is ``lua/retire.lua`` on the trajectory's two keys, then
``lua/unindex.lua`` on its index key: two calls, never one script over two tags.

A commit is one ``EVALSHA`` of ``lua/cas.lua`` over four keys in two slots, so it needs one
node (standalone or Sentinel), not Cluster. Transient errors are retried; a commit whose reply
was lost is resolved by reading its commit id back, and one still unresolved raises
:class:`StoreUnavailable` naming its commit id. Design: ``docs/adr/0014-redis-store.md``.
"""

from __future__ import annotations

import builtins
import hashlib
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import quote, unquote

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
    JsonObject,
    Outcome,
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
    direct_batch,
    direct_command,
    retry_transient,
    script_reply,
    text,
)

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
_SNAP_SUFFIX = "}:snap"
_PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")


def _load_script(name: str) -> str:
    return (Path(__file__).parent / "lua" / name).read_text(encoding="utf-8")


@lru_cache(maxsize=65536)
def _enc(part: str) -> str:
    return quote(part, safe="")


@lru_cache(maxsize=65536)
def _commit_keys(prefix: str, tenant: str, trajectory_id: str) -> tuple[str, str, str, str]:
    """Snapshot key, chain key, and the tenant's index and owing keys: built once per
    trajectory."""
    tag = f"{{{prefix}:{_enc(tenant)}:{_enc(trajectory_id)}"
    tenant_tag = f"{{{prefix}:{_enc(tenant)}}}"
    return f"{tag}{_SNAP_SUFFIX}", f"{tag}}}:chain", f"{tenant_tag}:index", f"{tenant_tag}:owing"


class RedisStore(TrajectoryStore):
    """The store on one Redis node; see the module docstring for keys, atomicity and retries."""

    def __init__(self, client: redis.Redis, *, prefix: str = "reins", retry_attempts: int = 5):
        if not _PREFIX_RE.match(prefix):
            raise ConfigError(f"REINS_KEY_PREFIX: {prefix!r} may hold only A-Z a-z 0-9 _ . : -")
        if retry_attempts < 1:
            raise ConfigError("REINS_REDIS_RETRY_ATTEMPTS: must be at least 1")
        self.prefix = prefix
        self._client = client
        self._attempts = retry_attempts
        self._cas_source = _load_script("cas.lua")
        self._cas_sha = hashlib.sha1(self._cas_source.encode()).hexdigest()
        self._execute = direct_command(client)  # the hot path: CAS and load, nothing else
        self._retire = client.register_script(_load_script("retire.lua"))
        self._unindex = client.register_script(_load_script("unindex.lua"))

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisStore:
        """The store at ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``."""
        return cls(
            client_for(settings),
            prefix=settings.key_prefix,
            retry_attempts=settings.redis_retry_attempts,
        )

    # --- keys ------------------------------------------------------------------------------

    def trajectory_keys(self, tenant: str, trajectory_id: str) -> tuple[str, str]:
        """The snapshot and chain keys of one trajectory (one hash tag)."""
        snap_key, chain_key, _, _ = _commit_keys(self.prefix, tenant, trajectory_id)
        return snap_key, chain_key

    def index_key(self, tenant: str) -> str:
        """The tenant's state index."""
        return f"{{{self.prefix}:{_enc(tenant)}}}:index"

    def index_keys(self, tenant: str) -> builtins.list[str]:
        """Every key of the tenant's state index (one today)."""
        return [self.index_key(tenant)]

    def index_key_for(self, tenant: str, trajectory_id: str) -> str:
        """The index key that lists ``trajectory_id``."""
        return self.index_key(tenant)

    def owing_key(self, tenant: str) -> str:
        """The tenant's list of ended runs that still owe a settlement."""
        return f"{{{self.prefix}:{_enc(tenant)}}}:owing"

    def ledger_key(self, tenant: str, key: str) -> str:
        """Where the result recorded under an idempotency key lives."""
        return f"{{{self.prefix}:{_enc(tenant)}:{_enc(key)}}}:idem"

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
        try:
            return fn()
        except TRANSIENT:
            return self._retrying(what, fn, first_failed=True)
        except RedisError as exc:
            raise StoreError(f"{what}: {exc}") from exc

    # --- snapshots -------------------------------------------------------------------------

    def apply(self, commit: Commit, before: Sequence[tuple[Any, ...]] = ()) -> int:
        """One EVALSHA of cas.lua; a lost reply is resolved by commit id (module docstring).

        ``before``: commands the server runs first, in the same round trip (idempotent ones:
        they are sent again with a commit that must be sent again). A worker that admits a
        turn itself writes its holding this way (:mod:`worker.follow_on`): it is in place before
        the admission is, and costs no round trip of its own."""
        snap_key, chain_key, index_key, owing_key = _commit_keys(
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
        )
        if commit.rows:
            call = (*call, commit.first_row, *commit.rows)
        try:
            reply = self._run_cas(call, before)
        except TRANSIENT:
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
        return settle(commit, Outcome(reply[0]), reply[1])

    def _run_cas(
        self, call: Sequence[bytes | str | int], before: Sequence[tuple[Any, ...]] = ()
    ) -> list[int]:
        """EVALSHA cas.lua with 4 keys (after ``before``, in one round trip), loading the
        script once more if the server lost it."""
        if before:
            batch = direct_batch(self._client)
            for command in before:
                batch.execute_command(*command)
            batch.execute_command("EVALSHA", self._cas_sha, 4, *call)
            replies = batch.execute(raise_on_error=False)
            for reply_ in replies[:-1]:
                if isinstance(reply_, Exception):
                    raise reply_
            return cast(list[int], script_reply(replies[-1], lambda: self._run_cas(call)))
        try:
            reply: list[int] = self._execute("EVALSHA", self._cas_sha, 4, *call)
        except NoScriptError:
            self._client.script_load(self._cas_source)
            reply = self._execute("EVALSHA", self._cas_sha, 4, *call)
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
            return [Outcome.REPEAT, commit.version]
        current_version = int(text(current)) if current is not None else 0
        if current_version != commit.expected_version:
            return [Outcome.CONFLICT, current_version]
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

    def list(self, tenant: str, state: LifecycleState | None = None) -> builtins.list[str]:
        """Ids from the tenant's index (one score range per state), sorted."""
        key = self.index_key(tenant)
        low, high = ("-inf", "+inf") if state is None else (STATE_CODES[state],) * 2
        members = self._read(
            f"listing tenant {tenant}", lambda: self._client.zrangebyscore(key, low, high)
        )
        skip = len(self.prefix) + len(_enc(tenant)) + 3  # "{P:T:"
        return sorted(unquote(text(m)[skip : -len(_SNAP_SUFFIX)]) for m in members)

    def page(
        self, tenant: str, state: LifecycleState, offset: int, limit: int
    ) -> builtins.list[str]:
        """One ``ZRANGEBYSCORE ... LIMIT`` over the state's score: snapshot-key order."""
        key, code = self.index_key(tenant), STATE_CODES[state]
        members = self._read(
            f"paging tenant {tenant}",
            lambda: self._client.zrangebyscore(key, code, code, start=offset, num=limit),
        )
        skip = len(self.prefix) + len(_enc(tenant)) + 3  # "{P:T:"
        return [unquote(text(m)[skip : -len(_SNAP_SUFFIX)]) for m in members]

    def count(self, tenant: str, state: LifecycleState | None = None) -> int:
        """ZCOUNT over the tenant's index (one score per state): no ids are read."""
        key = self.index_key(tenant)
        low, high = ("-inf", "+inf") if state is None else (STATE_CODES[state],) * 2
        found: Any = self._read(
            f"counting tenant {tenant}", lambda: self._client.zcount(key, low, high)
        )
        return int(found)

    def owing(self, tenant: str, limit: int = 1000) -> builtins.list[str]:
        """The first ``limit`` ids of the tenant's owing zset (score 0: in id order)."""
        key = f"{{{self.prefix}:{_enc(tenant)}}}:owing"
        members = self._read(
            f"listing what tenant {tenant} owes", lambda: self._client.zrange(key, 0, limit - 1)
        )
        return [text(m) for m in members]

    def committed(self, tenant: str, trajectory_id: str, version: int) -> str | None:
        """The commit id stored for ``version``, or None."""
        snap_key = self.trajectory_keys(tenant, trajectory_id)[0]
        stored = self._read(
            f"reading commits of trajectory {trajectory_id}",
            lambda: self._client.hget(snap_key, f"c{version}"),
        )
        return None if stored is None else text(stored)

    def retire(self, tenant: str, trajectory_id: str, expected_version: int) -> Retirement:
        """Two calls, each on one hash tag: retire.lua deletes the snapshot and chain (if
        still at ``expected_version`` and ended), then unindex.lua removes the index entry.

        Whether the run owes is read from the record at that version (the version pins its
        content), so the owing list, kept by every commit, holds no entry for it. An
        interrupted retire leaves the index entry alone; the next retire of the id finds no
        snapshot and removes it (``GONE``). Both scripts are safe to send again.
        """
        snap_key, chain_key = self.trajectory_keys(tenant, trajectory_id)
        try:
            record = self.load(tenant, trajectory_id)
        except SnapshotNotFound:
            self._drop_entry(tenant, trajectory_id, snap_key)
            return Retirement.GONE
        if record.record_version != expected_version:
            return Retirement.CHANGED
        if not retirable(record):
            return Retirement.KEPT
        outcome, _ = self._retrying(
            f"retiring trajectory {trajectory_id}",
            lambda: self._retire(keys=[snap_key, chain_key], args=[expected_version]),
        )
        if outcome < 0:
            return Retirement.CHANGED
        self._drop_entry(tenant, trajectory_id, snap_key)
        return Retirement.RETIRED if outcome > 0 else Retirement.GONE

    def _drop_entry(self, tenant: str, trajectory_id: str, snap_key: str) -> None:
        """The second call of a retire: the ended trajectory's index entry (unindex.lua) and
        any owing entry, in one pipeline of two commands (each on its own key, no MULTI). A
        retired run owed nothing, so the owing entry is there only if a commit's owing write
        was ever cut off from the commit: it names a trajectory that is gone."""
        index_key, owing_key = self.index_key_for(tenant, trajectory_id), self.owing_key(tenant)

        def drop() -> None:
            pipe = self._client.pipeline(transaction=False)
            self._unindex(keys=[index_key], args=[snap_key], client=pipe)
            pipe.zrem(owing_key, trajectory_id)
            pipe.execute()

        self._retrying(f"removing trajectory {trajectory_id} from the index", drop)

    def rebuild_index(self, tenant: str) -> int:
        """Rebuild the tenant's state index from its snapshots; return how many it lists.

        A repair tool (the index is derived): run it when the tenant's trajectories are quiet,
        since a commit that lands during the scan may be indexed under its older state.
        """
        pattern = f"{{{self.prefix}:{_enc(tenant)}:*{_SNAP_SUFFIX}"

        def rebuild() -> int:
            members: dict[str, int] = {}
            for key in self._client.scan_iter(match=pattern, count=1000):
                code = self._client.hget(key, "s")
                if code is not None:
                    members[text(key)] = int(text(code))
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self.index_key(tenant))
            if members:
                pipe.zadd(self.index_key(tenant), members)
            pipe.execute()
            return len(members)

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
