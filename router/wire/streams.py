"""A Redis stream read by the routers' consumer group: taken, acknowledged once done, reclaimed.

Workers and the API append entries (``XADD``; one field, :data:`FIELD`, holds the encoded
value). Every router reads as consumer ``<its name>`` of the group :data:`GROUP`, so each entry
goes to one router at a time and stays in that router's pending entries until it is
acknowledged. A :class:`GroupReader` is one router's reader of one stream:

- :meth:`~GroupReader.take` delivers new entries (``XREADGROUP >``); the caller acts on them
  and then calls :meth:`~GroupReader.done`, and only then are they acknowledged and deleted
  (``XACK`` + ``XDEL``), in the same round trip as the next read. A take that finds earlier
  entries handed out and never done (their effect failed, or the router restarted under the
  same name) reads this router's own pending entries first (``XREADGROUP 0``).
- :meth:`~GroupReader.reclaim` claims entries any router left pending longer than
  ``reclaim_after_s`` (``XAUTOCLAIM``): a router that died mid-batch is taken over.
- An entry that does not decode is *poison*: it is moved to the dead-letter stream with the
  error, the raw bytes and the stream it came from, then acknowledged and deleted; the rest of
  its batch goes on.

Acting on an entry twice must be harmless: delivery is at least once. Replies are RESP2, raw
(:class:`store.redis_direct.DirectBatch`) or as redis-py parses them (its pipeline). Design:
``docs/adr/0045-durable-feed.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
from redis.exceptions import RedisError, ResponseError

from kernel.errors import ConfigError, InvalidInput, StoreError, StoreUnavailable
from store.redis_client import TRANSIENT, Batch, text
from store.redis_direct import direct_batch

log = logging.getLogger("reins.router.streams")
_T = TypeVar("_T")

GROUP = "routers"  #: the consumer group every router reads in, under its own name
FIELD = b"v"  #: the one field of an entry: the encoded value
DEAD_CAP = 10_000  #: dead letters kept (approximately; the oldest are trimmed first)
RAW_CAP = 4096  #: bytes of a poison entry kept in its dead letter

#: Told how many poison entries of a source were moved to the dead-letter stream.
PoisonReport = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class Taken(Generic[_T]):
    """Values a router took from a stream and the ids of their entries, in the same order;
    iterating yields the values."""

    items: tuple[_T, ...] = ()
    ids: tuple[bytes, ...] = ()

    def __iter__(self) -> Iterator[_T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __add__(self, other: Taken[_T]) -> Taken[_T]:
        return Taken(self.items + other.items, self.ids + other.ids)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An entry that did not decode, as the dead-letter stream keeps it."""

    id: str  # the dead letter's own entry id: when it was buried (ms since the epoch)
    source: str  # notices, handbacks
    stream: str  # the key it was taken from
    entry: str  # its id there
    error: str
    raw: bytes

    @property
    def at(self) -> float:
        """When the entry was moved here, in seconds since the epoch."""
        return int(self.id.split("-", 1)[0]) / 1000


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """An entry a router took and has not acknowledged yet."""

    stream: str
    id: str
    router: str
    idle_s: float  # since it was last delivered
    deliveries: int


def ensure_group(client: redis.Redis, key: str) -> bool:
    """Create the group on ``key`` (and the stream, empty, if there is none), reading from its
    first entry; True if it was created, False if it existed. Idempotent."""
    try:
        client.xgroup_create(key, GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if str(exc).startswith("BUSYGROUP"):
            return False
        raise StoreError(f"{key}: cannot create group {GROUP}: {exc}") from exc
    except TRANSIENT as exc:
        raise StoreUnavailable(f"{key}: cannot create group {GROUP}: {exc}") from exc
    return True


def append(pipe: Batch, key: str, value: bytes) -> None:
    """Queue one entry's ``XADD`` on ``pipe``."""
    pipe.execute_command("XADD", key, "*", FIELD, value)


def execute(pipe: Batch, what: str) -> list[Any]:
    """Send ``pipe``; a Redis failure becomes :class:`StoreUnavailable` (unreachable) or
    :class:`StoreError` naming ``what``."""
    try:
        return pipe.execute()
    except RedisError as exc:
        raise _store_error(what, exc) from exc


class GroupReader(Generic[_T]):
    """One router's reader of one stream in the group :data:`GROUP` (see the module docstring).

    Not thread-safe: one per router loop. ``decode`` raises :class:`InvalidInput` for an entry
    that is not a value of this stream; ``on_poison(source, count)`` hears of dead letters.
    """

    def __init__(
        self,
        client: redis.Redis,
        key: str,
        *,
        consumer: str,
        source: str,
        decode: Callable[[bytes], _T],
        dead_key: str,
        reclaim_after_s: float,
        on_poison: PoisonReport | None = None,
    ) -> None:
        self.client, self.key, self.consumer, self.source = client, key, consumer, source
        self.decode, self.dead_key = decode, dead_key
        self.reclaim_after_ms = max(0, int(reclaim_after_s * 1000))
        self.on_poison = on_poison
        self._held: set[bytes] = set()  # handed out, not yet done
        self._acks: list[bytes] = []  # done, to acknowledge with the next round trip
        self._backlog = True  # first, what this consumer name left pending in an earlier life
        self._cursor: Any = b"0-0"  # where the next reclaim scans the group's pending entries

    # --- taking --------------------------------------------------------------------------------

    def take(self, limit: int, block_s: float = 0.0, *, more: bool = False) -> Taken[_T]:
        """Up to ``limit`` entries for this router, waiting up to ``block_s`` for the first;
        the acknowledgements of what was done since the last round trip go first in the same
        round trip. Entries handed out earlier and not done count as left: this router's own
        pending entries are read first, then new ones. ``more``: add new entries to those taken
        just before (no pending entries are read).

        Raises :class:`StoreUnavailable` or :class:`StoreError`; whatever was delivered then is
        in this router's pending entries, and the next take reads them first.
        """
        self._check_consumer()
        backlog = (self._backlog or bool(self._held)) and not more
        pipe = direct_batch(self.client)
        acks = self._queue_acks(pipe)
        read: list[Any] = ["XREADGROUP", "GROUP", GROUP, self.consumer, "COUNT", limit]
        if backlog:  # this router's own pending entries, then new ones without waiting
            pipe.execute_command(*read, "STREAMS", self.key, "0")
        elif block_s > 0:
            read += ["BLOCK", max(1, int(block_s * 1000))]
        pipe.execute_command(*read, "STREAMS", self.key, ">")
        replies = self._send(pipe, acks, reads=2 if backlog else 1)
        if replies is None:
            return Taken()
        entries = _stream_entries(replies[-1])
        if backlog:
            again = _stream_entries(replies[0])
            self._held.clear()  # all of them are in this read, or after it while it is full
            self._backlog = len(again) >= limit
            if again:
                log.info("%s took %d %s back from its pending entries", *self._who(again))
            entries = again + entries
        return self._accept(entries)

    def reclaim(self, limit: int) -> Taken[_T]:
        """Claim up to ``limit`` entries left pending by any router (this one included) for
        longer than ``reclaim_after_s``; they are this router's to act on and mark done."""
        self._check_consumer()
        pipe = direct_batch(self.client)
        acks = self._queue_acks(pipe)
        pipe.execute_command(
            "XAUTOCLAIM",
            self.key,
            GROUP,
            self.consumer,
            self.reclaim_after_ms,
            self._cursor,
            "COUNT",
            limit,
        )
        replies = self._send(pipe, acks)
        if replies is None:
            return Taken()
        reply = replies[0]
        self._cursor = reply[0]
        entries = list(reply[1] or ())
        if entries:
            log.warning(
                "%s took over %d %s left pending for over %.1fs",
                *self._who(entries),
                self.reclaim_after_ms / 1000,
            )
        return self._accept(entries)

    # --- acknowledging -------------------------------------------------------------------------

    def done(self, taken: Taken[_T]) -> None:
        """The effect of every value in ``taken`` is durable: acknowledge and delete their
        entries with the next round trip (a take, a reclaim or :meth:`flush`)."""
        self._held.difference_update(taken.ids)
        self._acks.extend(taken.ids)

    def flush(self, pipeline: Batch | None = None) -> None:
        """Acknowledge and delete what is done now (one round trip), or queue that on
        ``pipeline`` for the caller to execute; nothing is sent when nothing is done."""
        if pipeline is not None:
            self._queue_acks(pipeline)
            return
        if self._acks:
            pipe = direct_batch(self.client)
            acks = self._queue_acks(pipe)
            try:
                execute(pipe, self.key)
            except StoreError:
                self._acks[:0] = acks
                raise

    # --- internals -----------------------------------------------------------------------------

    def _check_consumer(self) -> None:
        if not self.consumer:
            raise ConfigError(f"{self.key}: only a router's feed takes entries (no consumer name)")

    def _queue_acks(self, pipe: Batch) -> list[bytes]:
        acks, self._acks = self._acks, []
        if acks:
            pipe.execute_command("XACK", self.key, GROUP, *acks)
            pipe.execute_command("XDEL", self.key, *acks)
        return acks

    def _send(self, pipe: Batch, acks: list[bytes], reads: int = 1) -> list[Any] | None:
        """Execute ``pipe`` (acknowledgements, then ``reads`` reads); the reads' replies, or
        None when the group was gone and has been created again."""
        try:
            replies = pipe.execute(raise_on_error=False)[-reads:]
        except RedisError as exc:
            self._acks[:0] = acks  # acknowledging again is harmless
            self._backlog = True  # the read may have delivered entries this router never saw
            raise _store_error(self.key, exc) from exc
        for reply in replies:
            if not isinstance(reply, ResponseError):
                continue
            if not str(reply).startswith("NOGROUP"):
                raise StoreError(f"{self.key}: {reply}")
            ensure_group(self.client, self.key)  # the Redis lost its data: start afresh
            log.warning("%s: group %s was gone; created again", self.key, GROUP)
            self._held.clear()
            self._cursor = b"0-0"
            return None
        return replies

    def _accept(self, entries: Sequence[Any]) -> Taken[_T]:
        """Decode entries; acknowledge deleted ones with the next round trip and move poison
        ones to the dead-letter stream now."""
        items: list[_T] = []
        ids: list[bytes] = []
        poison: list[tuple[bytes, bytes, str]] = []
        for entry_id, fields in entries:
            try:
                value = _value(fields)
                if value is None:  # deleted after it was delivered: nothing to act on
                    self._acks.append(entry_id)
                    continue
                items.append(self.decode(value))
                ids.append(entry_id)
            except InvalidInput as exc:
                poison.append((entry_id, _raw(fields), str(exc)))
        self._held.update(ids)
        if poison:
            self._bury(poison)
        return Taken(tuple(items), tuple(ids))

    def _bury(self, poison: list[tuple[bytes, bytes, str]]) -> None:
        """Dead letters first, then the acknowledgement, in one round trip; if it fails, the
        entries stay pending and are taken again."""
        pipe = direct_batch(self.client)
        for entry_id, raw, error in poison:
            pipe.execute_command(
                "XADD",
                self.dead_key,
                "MAXLEN",
                "~",
                DEAD_CAP,
                "*",
                "source",
                self.source,
                "stream",
                self.key,
                "entry",
                entry_id,
                "error",
                error[:1000],
                "raw",
                raw[:RAW_CAP],
            )
        ids = [entry_id for entry_id, _, _ in poison]
        pipe.execute_command("XACK", self.key, GROUP, *ids)
        pipe.execute_command("XDEL", self.key, *ids)
        try:
            execute(pipe, self.dead_key)
        except StoreError:
            self._backlog = True
            raise
        for entry_id, raw, error in poison:
            log.error("%s %s is dead: %s: %r", self.source, text(entry_id), error, raw[:200])
        if self.on_poison is not None:
            self.on_poison(self.source, len(poison))

    def _who(self, entries: Sequence[Any]) -> tuple[str, int, str]:
        return self.consumer, len(entries), self.source


def _store_error(key: str, exc: RedisError) -> StoreError:
    if isinstance(exc, TRANSIENT):
        return StoreUnavailable(f"{key}: Redis unreachable ({exc})")
    return StoreError(f"{key}: {exc}")


def _stream_entries(reply: Any) -> list[Any]:
    """The entries of a one-stream ``XREADGROUP`` reply: raw (a list of [key, entries], or
    None) or as redis-py parses it (the same list, or a mapping of key to entries)."""
    if not reply:
        return []
    streams = reply.values() if isinstance(reply, dict) else (s[1] for s in reply)
    return [entry for entries in streams for entry in entries or ()]


def _value(fields: Any) -> bytes | None:
    """The value of an entry's fields (a flat list raw, a mapping parsed); None for an entry
    deleted since (no fields); :class:`InvalidInput` when :data:`FIELD` is missing."""
    if not fields:
        return None
    if type(fields) is list and len(fields) == 2 and fields[0] == FIELD:  # as XADD wrote it
        found = fields[1]
    else:
        found = fields.get(FIELD) if isinstance(fields, dict) else _pairs(fields).get(FIELD)
    if not isinstance(found, bytes):
        raise InvalidInput(f"entry without a {FIELD.decode()!r} field")
    return found


def entry_value(fields: Any) -> bytes | None:
    """What an entry read by ``XRANGE`` carries, to append elsewhere: its value, or (an entry
    without one) its fields as bytes, which the reader buries as poison; None when deleted."""
    return _raw(fields) if fields else None


def _pairs(fields: Sequence[Any]) -> dict[Any, Any]:
    it = iter(fields)
    return dict(zip(it, it, strict=False))


def _raw(fields: Any) -> bytes:
    """What a poison entry held, as bytes: its value, or all of its fields."""
    flat = fields.get(FIELD) if isinstance(fields, dict) else None
    if flat is None and isinstance(fields, list) and fields[:1] == [FIELD] and len(fields) == 2:
        flat = fields[1]
    if isinstance(flat, bytes):
        return flat
    return repr(fields).encode()


# --- inspection (reins doctor) -----------------------------------------------------------------


def dead_letters(client: redis.Redis, key: str, limit: int) -> list[DeadLetter]:
    """The newest ``limit`` dead letters of ``key``, newest first."""
    out = []
    reply: Any = client.xrevrange(key, count=limit)
    for entry_id, fields in reply or ():
        f = fields if isinstance(fields, dict) else _pairs(fields or ())
        raw = f.get(b"raw", b"")
        out.append(
            DeadLetter(
                id=text(entry_id),
                source=text(f.get(b"source", b"")),
                stream=text(f.get(b"stream", b"")),
                entry=text(f.get(b"entry", b"")),
                error=text(f.get(b"error", b"")),
                raw=raw if isinstance(raw, bytes) else str(raw).encode(),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class GroupLag:
    """How far the routers' group trails a stream: entries not yet delivered to any router
    (``lag``; -1 when Redis cannot tell) and entries delivered and not yet acknowledged."""

    lag: int
    pending: int


def group_lag(client: redis.Redis, keys: Sequence[str]) -> dict[str, GroupLag]:
    """The routers' group's lag on each of ``keys`` (one round trip); a stream or group that
    does not exist yet is left out."""
    pipe = direct_batch(client)
    for key in keys:
        pipe.execute_command("XINFO", "GROUPS", key)
    out: dict[str, GroupLag] = {}
    for key, reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):
            continue
        for group in reply:
            info = _pairs(group) if isinstance(group, list) else group
            fields = {text(k): v for k, v in info.items()}
            if text(fields.get("name", b"")) == GROUP:
                lag = fields.get("lag")
                out[key] = GroupLag(-1 if lag is None else int(lag), int(fields["pending"]))
    return out


def pending_counts(client: redis.Redis, key: str) -> dict[str, int]:
    """How many entries of ``key`` each router has taken and not acknowledged (empty when the
    stream or the group does not exist yet)."""
    try:
        summary: Any = client.xpending(key, GROUP)
    except ResponseError as exc:
        if str(exc).startswith("NOGROUP"):
            return {}
        raise
    return {text(c["name"]): int(c["pending"]) for c in summary["consumers"]}


def pending_entries(
    client: redis.Redis, key: str, limit: int, router: str | None = None
) -> list[PendingEntry]:
    """Up to ``limit`` entries of ``key`` taken and not acknowledged (by ``router``, or by any),
    oldest first; none when the stream or the group does not exist yet."""
    try:
        rows: Any = client.xpending_range(
            key, GROUP, min="-", max="+", count=limit, consumername=router
        )
    except ResponseError as exc:
        if str(exc).startswith("NOGROUP"):
            return []
        raise
    return [
        PendingEntry(
            key,
            text(row["message_id"]),
            text(row["consumer"]),
            int(row["time_since_delivered"]) / 1000,
            int(row["times_delivered"]),
        )
        for row in rows
    ]
