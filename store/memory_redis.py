"""Memory in Redis, for the fleet: each owner's items under the owner's own hash tag.

Keys of one owner O (``Owner.token``) share the tag ``{P:mem:O}``: an item hash per item, a
recency sorted set per kind, a set of item ids per (kind, tag term). A write, a delete and a
recall are each one Lua script over one owner's keys (``lua/memory_*.lua``, headers name the
keys), so each is atomic and works on Redis Cluster. Recall runs the script once per owner the
caller may see, in one pipeline, and merges: another owner's keys are never named.

The tenant's indexes share the tag ``{P:mem:T}``: ``ids`` (item id -> its owner and what it is
filed under) serves reads and deletes by id, always under the caller's tenant; ``u:<user>`` and
``c:<call>`` the items that concern a user and those a call's result shaped (erasure, removal
by source); ``x`` and ``w`` expiry and write time (the sweep), which also files the items of
0.2 and before in them, a page per sweep. ``memory_index.lua`` files an item
in all of them before the item is written, ``memory_unindex.lua`` unfiles it after the item is
deleted, so an item is always reachable by id, by user and by source; an index entry whose item
is gone reads as absent. Every call retries transient errors (each is safe to repeat: a put
replaces, a delete of nothing is a no-op).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from urllib.parse import quote

import redis

from kernel.errors import ConfigError
from kernel.memory import (
    MemoryItem,
    MemoryKind,
    Owner,
    Scope,
    Visibility,
    name_token,
    tag_token,
)
from kernel.settings import Settings
from store.memory_base import MemoryBank, Swept, newest_first
from store.redis_client import client_for, is_cluster, retry_transient, text
from store.scripts import run_batch, scripts_beside

SCRIPTS = scripts_beside(__file__)


class RedisMemory(MemoryBank):
    """Facts and episodes in Redis; see the module docstring."""

    def __init__(self, client: redis.Redis, *, prefix: str = "reins", retry_attempts: int = 5):
        if retry_attempts < 1:
            raise ConfigError("REINS_REDIS_RETRY_ATTEMPTS: must be at least 1")
        self.prefix = prefix
        self._client = client
        self._attempts = retry_attempts
        self._put = SCRIPTS("memory_put.lua")
        self._delete = SCRIPTS("memory_delete.lua")
        self._recall = SCRIPTS("memory_recall.lua")
        self._index = SCRIPTS("memory_index.lua")
        self._unindex = SCRIPTS("memory_unindex.lua")

    @classmethod
    def from_settings(cls, settings: Settings) -> RedisMemory:
        """Memory on ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``."""
        return cls(
            client_for(settings),
            prefix=settings.key_prefix,
            retry_attempts=settings.redis_retry_attempts,
        )

    # --- keys ------------------------------------------------------------------------------

    def stem(self, owner_token: str) -> str:
        """The common start of every key of one owner (its hash tag included)."""
        return f"{{{self.prefix}:mem:{owner_token}}}:"

    def tenant_stem(self, tenant: str) -> str:
        """The common start of every index key of one tenant (its hash tag included)."""
        return f"{{{self.prefix}:mem:{quote(tenant, safe='')}}}:"

    def ids_key(self, tenant: str) -> str:
        """The tenant's id index."""
        return self.tenant_stem(tenant) + "ids"

    def _index_keys(self, tenant: str) -> list[str]:
        stem = self.tenant_stem(tenant)
        return [f"{stem}ids", f"{stem}x", f"{stem}w"]

    def _run(self, what: str, fn: Any) -> Any:
        return retry_transient(fn, what=what, attempts=self._attempts, counted=self._attempts)

    # --- the contract ----------------------------------------------------------------------

    def put(self, item: MemoryItem) -> None:
        """See :meth:`MemoryBank.put`."""
        self.put_many([item])

    def put_many(self, items: Iterable[MemoryItem], batch: int = 500) -> None:
        """Write ``items``, each one atomic step (pipelined ``batch`` at a time)."""
        pending: list[MemoryItem] = []
        for item in items:
            pending.append(item)
            if len(pending) >= batch:
                self._run("writing memory items", partial(self._put_batch, pending))
                pending = []
        if pending:
            self._run("writing memory items", partial(self._put_batch, pending))

    def _scripted(self, queue: Callable[[Any], None]) -> list[Any]:
        """Send what ``queue`` puts on a pipeline (scripts as bare ``EVALSHA``, which a cluster
        pipeline takes too); a server that lost the scripts gets them and the batch once more
        (each command in it is safe to repeat)."""

        def send() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            queue(pipe)
            return pipe.execute(raise_on_error=False)

        scripts = (self._put, self._delete, self._recall, self._index, self._unindex)
        return run_batch(self._client, send, scripts)

    def _in_order(self, first: Callable[[Any], None], then: Callable[[Any], None]) -> list[Any]:
        """``first``'s commands, then ``then``'s: in one pipeline on one node, in two on a
        cluster (where a pipeline's commands to different masters have no order)."""
        if is_cluster(self._client):
            return [*self._scripted(first), *self._scripted(then)]

        def both(pipe: Any) -> None:
            first(pipe)
            then(pipe)

        return self._scripted(both)

    def _put_batch(self, items: list[MemoryItem]) -> None:
        def index(pipe: Any) -> None:
            for item in items:
                entry = {
                    "o": [item.scope.value, item.subject],
                    "u": [name_token(u) for u in item.concerns],
                    "c": [name_token(c) for c in item.call_ids],
                }
                args = [
                    item.item_id,
                    json.dumps(entry),
                    self.tenant_stem(item.tenant),
                    "" if item.expires_ms is None else item.expires_ms,
                    item.written_ms,
                ]
                pipe.execute_command(*self._index.command(self._index_keys(item.tenant), args))

        def write(pipe: Any) -> None:
            for item in items:
                stem = self.stem(item.owner.token)
                keys = [f"{stem}i:{item.item_id}", f"{stem}r:{item.kind.value}"]
                args = [
                    item.item_id,
                    item.kind.value,
                    item.model_dump_json(),
                    item.written_ms,
                    "" if item.expires_ms is None else item.expires_ms,
                    stem,
                    *(tag_token(t) for t in item.tags),
                ]
                pipe.execute_command(*self._put.command(keys, args))

        self._in_order(index, write)  # the indexes first: an item is never unfiled

    def _ranked(
        self, vis: Visibility, kind: MemoryKind, wanted: tuple[str, ...], now_ms: int, limit: int
    ) -> list[MemoryItem]:
        """One script per visible owner in one pipeline, merged (the module docstring)."""

        def queue(pipe: Any) -> None:
            for owner in vis.owners():
                stem = self.stem(owner.token)
                keys = [
                    f"{stem}r:{kind.value}",
                    f"{stem}scratch",
                    *(f"{stem}t:{kind.value}:{tag_token(t)}" for t in wanted),
                ]
                pipe.execute_command(
                    "EVALSHA", self._recall.sha, len(keys), *keys, now_ms, limit, stem
                )

        def ask() -> list[Any]:
            return self._scripted(queue)

        replies = self._run("recalling memory", ask)
        found = [MemoryItem.model_validate_json(d) for reply in replies for d in reply]
        wanted_set = set(wanted)
        found.sort(
            key=lambda i: (len(wanted_set.intersection(i.tags)), i.written_ms, i.item_id),
            reverse=True,
        )
        return found[:limit]

    def get(self, tenant: str, item_id: str) -> MemoryItem | None:
        """See :meth:`MemoryBank.get`."""
        found = self._read(tenant, [item_id])
        return found[0] if found else None

    def _read(self, tenant: str, item_ids: Iterable[str]) -> list[MemoryItem]:
        """The items of ``item_ids`` that ``tenant`` holds (two round trips: where each is
        filed, then the items)."""
        ids = list(dict.fromkeys(item_ids))
        if not ids:
            return []
        owners: list[Any] = self._run(
            f"reading {len(ids)} memory items",
            partial(self._client.hmget, self.ids_key(tenant), ids),
        )
        return self._fetch(tenant, [(i, o) for i, o in zip(ids, owners, strict=True) if o])

    def _fetch(self, tenant: str, filed: list[tuple[str, Any]]) -> list[MemoryItem]:
        def fetch() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for item_id, entry in filed:
                stem = self.stem(_owner_from_json(tenant, text(entry)).token)
                pipe.hget(f"{stem}i:{item_id}", "d")
            return pipe.execute()

        found = self._run("reading memory items", fetch) if filed else []
        return [MemoryItem.model_validate_json(d) for d in found if d]

    def _tenant_items(self, tenant: str) -> list[MemoryItem]:
        index: dict[bytes, bytes] = self._run(
            f"listing memory of {tenant}", partial(self._client.hgetall, self.ids_key(tenant))
        )
        return self._fetch(tenant, [(text(i), o) for i, o in index.items()])

    def concerning(self, tenant: str, user: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.concerning`: the user's set of the index, and the user's own
        scope's recency sets (items filed before ``concerns`` was recorded)."""
        own = self.stem(Owner(tenant, Scope.USER, user).token)

        def ask() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            pipe.smembers(f"{self.tenant_stem(tenant)}u:{name_token(user)}")
            for kind in MemoryKind:
                pipe.zrange(f"{own}r:{kind.value}", 0, -1)
            return pipe.execute()

        replies = self._run(f"reading the memory of a user of {tenant}", ask)
        ids = sorted({text(i) for reply in replies for i in reply})
        return newest_first(i for i in self._read(tenant, ids) if i.concerns_user(user))

    def from_source(self, tenant: str, call_id: str) -> list[MemoryItem]:
        """See :meth:`MemoryBank.from_source`."""
        key = f"{self.tenant_stem(tenant)}c:{name_token(call_id)}"
        ids = self._run(f"reading what {call_id} wrote", partial(self._client.smembers, key))
        found = self._read(tenant, sorted(text(i) for i in ids))
        return newest_first(i for i in found if call_id in i.call_ids)

    def delete(self, tenant: str, item_id: str) -> bool:
        """See :meth:`MemoryBank.delete`."""
        return bool(self._delete_ids(tenant, [item_id]))

    def _delete_all(self, tenant: str, items: list[MemoryItem]) -> list[MemoryItem]:
        gone = set(self._delete_ids(tenant, [i.item_id for i in items]))
        return [i for i in items if i.item_id in gone]

    def _delete_ids(
        self, tenant: str, item_ids: list[str], now_ms: int | None = None, cutoff_ms: int = -1
    ) -> list[str]:
        """Delete the items ``item_ids`` of ``tenant`` (when ``now_ms`` is given, only those
        still due for a sweep at it, with ``cutoff_ms`` its retention's cutoff), then unfile
        them; the ids of the items deleted."""
        if not item_ids:
            return []
        owners: list[Any] = self._run(
            f"deleting {len(item_ids)} memory items",
            partial(self._client.hmget, self.ids_key(tenant), item_ids),
        )
        when = ["", ""] if now_ms is None else [now_ms, "" if cutoff_ms < 0 else cutoff_ms]
        located = [(i, o) for i, o in zip(item_ids, owners, strict=True) if o]

        def delete(pipe: Any) -> None:
            for item_id, entry in located:
                stem = self.stem(_owner_from_json(tenant, text(entry)).token)
                keys, args = [f"{stem}i:{item_id}"], [item_id, stem, *when]
                pipe.execute_command(*self._delete.command(keys, args))

        def unindex(pipe: Any) -> None:
            keys, stem = self._index_keys(tenant), self.tenant_stem(tenant)
            for item_id in item_ids:
                pipe.execute_command(*self._unindex.command(keys, [item_id, stem, *when]))

        def both() -> list[Any]:
            return self._in_order(delete, unindex)  # the item first: never unfiled while held

        replies = self._run(f"deleting {len(item_ids)} memory items", both)
        return [i for (i, _), r in zip(located, replies, strict=False) if int(r) == 1]

    def sweep(self, tenant: str, now_ms: int, keep_ms: int | None, limit: int) -> Swept:
        """See :meth:`MemoryBank.sweep`: the due ids read from the expiry and write-time sets,
        each deleted only if still due (``memory_delete.lua``, ``memory_unindex.lua``)."""
        self._file_older_entries(tenant, limit)
        _, x_key, w_key = self._index_keys(tenant)
        cutoff = -1 if keep_ms is None else now_ms - keep_ms

        def ask() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            pipe.zrangebyscore(x_key, "-inf", now_ms, start=0, num=limit + 1)
            pipe.zrangebyscore(w_key, "-inf", cutoff, start=0, num=limit + 1)
            return pipe.execute()

        replies = self._run(f"sweeping the memory of {tenant}", ask)
        due = list(dict.fromkeys(text(i) for reply in replies for i in reply))
        gone = self._delete_ids(tenant, due[:limit], now_ms, cutoff)
        return Swept(len(gone), len(due) > limit)

    def _file_older_entries(self, tenant: str, count: int) -> None:
        """File items written before 0.3 (a bare ``[scope, subject]`` id entry, so in no expiry
        or time set, and by none of its users) in every index, ``count`` entries of the id
        index a sweep: its cursor is kept in ``{P:mem:T}:filed``, ``done`` once walked."""
        mark = self.tenant_stem(tenant) + "filed"
        cursor = self._run("reading the filing cursor", partial(self._client.get, mark))
        if cursor == b"done":
            return
        scan = partial(self._client.hscan, self.ids_key(tenant), int(cursor or 0), count=count)
        after, entries = self._run(f"filing the older memory of {tenant}", scan)
        older = [text(i) for i, entry in entries.items() if text(entry).startswith("[")]
        items = self._read(tenant, older)
        if items:
            self._run("filing older memory items", partial(self._put_batch, items))
        self._run("filing", partial(self._client.set, mark, after or "done"))


def _owner_from_json(tenant: str, data: str) -> Owner:
    """The owner an id index entry names (a JSON object, or the bare pair of 0.2 and before)."""
    entry = json.loads(data)
    scope, subject = entry["o"] if isinstance(entry, dict) else entry
    return Owner(tenant, Scope(scope), subject)
