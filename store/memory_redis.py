"""Memory in Redis, for the fleet: each owner's items under the owner's own hash tag.

Keys of one owner O (``Owner.token``) share the tag ``{P:mem:O}``: an item hash per item, a
recency sorted set per kind, a set of item ids per (kind, tag term). A write, a delete and a
recall are each one Lua script over one owner's keys (``lua/memory_*.lua``, headers name the
keys), so each is atomic and works on Redis Cluster. Recall runs the script once per owner the
caller may see, in one pipeline, and merges: another owner's keys are never named.

The tenant's id index ``{P:mem:T}:ids`` (item id -> owner token) serves reads and deletes by id,
always under the caller's tenant. It is written before the item and cleared after it, so an item
is always reachable by id; an index entry whose item is gone reads as absent. Every call retries
transient errors (each is safe to repeat: a put replaces, a delete of nothing is a no-op).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any
from urllib.parse import quote

import redis

from kernel.errors import ConfigError
from kernel.memory import MemoryItem, MemoryKind, Owner, Scope, Visibility, tag_token
from kernel.settings import Settings
from store.memory_base import MemoryBank
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

    def ids_key(self, tenant: str) -> str:
        """The tenant's id index."""
        return f"{{{self.prefix}:mem:{quote(tenant, safe='')}}}:ids"

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

        return run_batch(self._client, send, (self._put, self._delete, self._recall))

    def _put_batch(self, items: list[MemoryItem]) -> None:
        def index(pipe: Any) -> None:
            for item in items:
                pipe.hset(self.ids_key(item.tenant), item.item_id, _owner_json(item.owner))

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

        def both(pipe: Any) -> None:
            index(pipe)
            write(pipe)

        if is_cluster(self._client):  # the id index is on other masters: in place first
            self._scripted(index)
            self._scripted(write)
        else:
            self._scripted(both)

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
        owner = self._run(
            f"reading memory item {item_id}",
            partial(self._client.hget, self.ids_key(tenant), item_id),
        )
        if owner is None:
            return None
        stem = self.stem(_owner_from_json(tenant, text(owner)).token)
        data = self._run(
            f"reading memory item {item_id}",
            partial(self._client.hget, f"{stem}i:{item_id}", "d"),
        )
        return None if data is None else MemoryItem.model_validate_json(data)

    def _tenant_items(self, tenant: str) -> list[MemoryItem]:
        index: dict[bytes, bytes] = self._run(
            f"listing memory of {tenant}", partial(self._client.hgetall, self.ids_key(tenant))
        )

        def fetch() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for item_id, owner in index.items():
                stem = self.stem(_owner_from_json(tenant, text(owner)).token)
                pipe.hget(f"{stem}i:{text(item_id)}", "d")
            return pipe.execute()

        return [MemoryItem.model_validate_json(d) for d in self._run("listing", fetch) if d]

    def delete(self, tenant: str, item_id: str) -> bool:
        """See :meth:`MemoryBank.delete`."""
        ids = self.ids_key(tenant)
        owner = self._run(
            f"deleting memory item {item_id}", partial(self._client.hget, ids, item_id)
        )
        if owner is None:
            return False
        stem = self.stem(_owner_from_json(tenant, text(owner)).token)
        existed = self._run(
            f"deleting memory item {item_id}",
            partial(self._delete.run, self._client, [f"{stem}i:{item_id}"], [item_id, stem]),
        )
        self._run(f"deleting memory item {item_id}", partial(self._client.hdel, ids, item_id))
        return bool(existed)

    def close(self) -> None:
        """Release the client's connections."""
        self._client.close()


def _owner_json(owner: Owner) -> str:
    return json.dumps([owner.scope.value, owner.subject])


def _owner_from_json(tenant: str, data: str) -> Owner:
    scope, subject = json.loads(data)
    return Owner(tenant, Scope(scope), subject)
