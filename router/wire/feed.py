"""The wire between routers and workers: turn messages, turn-end notices and cancels.

A router sends one :class:`TurnMessage` per turn through Celery to the member the ring names;
everything else travels through Redis under the fleet's hash tag ``{P:fleet}`` (P the key
prefix; one slot of a Redis Cluster, shared with custody, so a worker's notice and its custody
release stay one ordered batch: :mod:`router.wire.keyspace`):

============================  ========  ======================================================
``{P:fleet}:notices``         stream    notices (:mod:`router.wire.notices`, XADD): a trajectory
                                        is READY (submitted, or its turn ended so), or a turn
                                        ended otherwise (held, finished, idle); routers read it in
                                        the group ``routers`` and acknowledge a notice once its
                                        effect is durable (:mod:`router.wire.streams`)
``{P:fleet}:handbacks``       stream    :class:`HandBack` values: turn messages a member gave
                                        back unstarted (its drain grace ran out, or it cannot
                                        read the record); a router sends each on to another
                                        member, then acknowledges it
``{P:fleet}:dead``            stream    dead letters: entries of either stream that did not
                                        decode, with the error, the raw bytes and the source
``P:fleet:cancel``            channel   pub/sub: model call ids to cancel at once
                                        (``CancelCall``); a channel has no slot
``{P:fleet}:admissions``      list      one JSON entry per admission, for the fairness figures
``{P:fleet}:starts``          list      admission-to-start delays (ms) that workers report
``{P:fleet}:admitter``        string    the router that admits, while the admitter is local to
                                        a router process (its leadership:
                                        :mod:`router.process.chores`)
============================  ========  ======================================================

Every turn message a worker takes ends in exactly one notice or one hand-back. A notice is a
hint, never the truth: a router re-reads the record before acting on it, so one delivered twice
costs a load. A cancel is best effort. Design: ``docs/adr/0006-fleet-wire.md`` and
``docs/adr/0045-durable-feed.md``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar, cast

import redis

from router.admission.claims import AdmissionRecord
from router.wire.keyspace import fleet_tag, pre_cluster_streams
from router.wire.notices import Notice
from router.wire.streams import (
    GroupLag,
    GroupReader,
    PoisonReport,
    Taken,
    append,
    ensure_group,
    entry_value,
    execute,
    group_lag,
)
from router.wire.turns import (  # the worker's half of the wire, named here as before
    HandBack,
)
from store.redis_client import Batch
from store.redis_direct import direct_batch

log = logging.getLogger("reins.router.feed")
_V = TypeVar("_V")
STATS_CAP = 200_000  # the most entries the admissions and starts lists keep


def route_of(provider: str, model: str) -> str:
    """The provider route of a model: ``provider/model``, the name its quota gate goes by."""
    return f"{provider}/{model}"


def admission_entry(
    tenant: str, service_class: str, charge: int, *, by: str, at: float, backlogged: bool
) -> dict[str, Any]:
    """An admission as the figures keep it (:meth:`Feed.record_admissions`): tenant, class,
    charge, whether every configured tenant had READY work, who admitted it and when."""
    return {"t": tenant, "k": service_class, "c": charge, "b": backlogged, "r": by, "at": at}


class FeedSource(StrEnum):
    """The streams routers read, as dead letters and poison counts name them."""

    NOTICES = "notices"
    HANDBACKS = "handbacks"


class Feed:
    """The wire of one deployment (prefix) as one process sees it: its notices and hand-backs,
    the stats lists and the cancel channel.

    Anyone appends; only a feed built for a ``router`` takes (as that consumer of the group
    ``routers``, :mod:`router.wire.streams`). Entries left pending longer than ``reclaim_after_s``
    are taken over by :meth:`reclaim`; ``on_poison(source, count)`` hears of dead letters.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        router: str = "",
        reclaim_after_s: float = 5.0,
        on_poison: PoisonReport | None = None,
    ) -> None:
        self.client, self.router = client, router
        tag = fleet_tag(prefix)
        self.notices_key = f"{tag}:notices"
        self.handbacks_key = f"{tag}:handbacks"
        self.dead_key = f"{tag}:dead"
        self.cancel_channel = f"{prefix}:fleet:cancel"
        self.admissions_key = f"{tag}:admissions"
        self.starts_key = f"{tag}:starts"
        self.leadership_key = f"{tag}:admitter"
        # What older builds still append to, drained by drain_legacy (remove in 0.x+1): the
        # lists of the build before streams, and the streams of the build before the tag.
        self.legacy_keys = (f"{prefix}:fleet:ready", f"{prefix}:fleet:handback")
        self.legacy_streams = pre_cluster_streams(prefix)
        self._reclaim_after_s, self._on_poison = reclaim_after_s, on_poison
        self.notices = self._reader(self.notices_key, FeedSource.NOTICES, Notice.decode)
        self.handbacks = self._reader(self.handbacks_key, FeedSource.HANDBACKS, HandBack.decode)

    def create_groups(self) -> None:
        """Create the group ``routers`` on both streams unless it exists (a router's boot)."""
        ensure_group(self.client, self.notices_key)
        ensure_group(self.client, self.handbacks_key)

    def _reader(self, key: str, source: str, decode: Callable[[bytes], _V]) -> GroupReader[_V]:
        return GroupReader(
            self.client,
            key,
            consumer=self.router,
            source=source,
            decode=decode,
            dead_key=self.dead_key,
            reclaim_after_s=self._reclaim_after_s,
            on_poison=self._on_poison,
        )

    # --- notices -------------------------------------------------------------------------------

    def push(self, *notices: Notice, pipeline: Batch | None = None) -> None:
        """Append notices to the feed (one round trip, or queued on ``pipeline``)."""
        if notices:
            pipe = pipeline if pipeline is not None else self.batch()
            for n in notices:
                append(pipe, self.notices_key, n.encode())
            if pipeline is None:
                execute(pipe, self.notices_key)

    def batch(self) -> Batch:
        """A batch on the feed's Redis, to join a push to other writes."""
        return direct_batch(self.client)

    def take(self, limit: int = 256, block_s: float = 0.0, *, more: bool = False) -> Taken[Notice]:
        """Take up to ``limit`` notices, oldest first; wait up to ``block_s`` for the first.

        Each goes to one router at a time and stays pending until :meth:`done`; the notices
        done since the last round trip are acknowledged in this one. ``more``: add to notices
        taken just before and not done yet. A notice that does not decode goes to the dead
        letters and the rest are taken (:class:`router.wire.streams.GroupReader`).
        """
        return self.notices.take(limit, block_s, more=more)

    def reclaim(self, limit: int = 256) -> Taken[Notice]:
        """Take over up to ``limit`` notices left pending longer than ``reclaim_after_s``."""
        return self.notices.reclaim(limit)

    def done(self, taken: Taken[Notice]) -> None:
        """The notices of ``taken`` were acted on durably: acknowledge them with the next
        round trip (or :meth:`flush`)."""
        self.notices.done(taken)

    def flush(self) -> None:
        """Acknowledge the notices done now, if any wait (one round trip)."""
        self.notices.flush()

    def lag(self) -> dict[str, GroupLag]:
        """How far the routers' group trails each stream, by source (one round trip)."""
        keys = {self.notices_key: FeedSource.NOTICES, self.handbacks_key: FeedSource.HANDBACKS}
        return {keys[k].value: v for k, v in group_lag(self.client, list(keys)).items()}

    def depth(self) -> int:
        """How many notices wait or are taken and not yet acknowledged."""
        waiting: Any = self.client.xlen(self.notices_key)
        return int(waiting)

    # --- hand-backs ----------------------------------------------------------------------------

    def hand_back(self, *entries: HandBack) -> None:
        """Give turn messages back for a router to send on (one round trip)."""
        if entries:
            pipe = self.batch()
            for e in entries:
                append(pipe, self.handbacks_key, e.encode())
            execute(pipe, self.handbacks_key)

    def take_handbacks(self, limit: int = 256) -> Taken[HandBack]:
        """Take up to ``limit`` hand-backs, oldest first, and up to ``limit`` more that were
        left pending longer than ``reclaim_after_s``; each stays pending until
        :meth:`settle_handbacks`. One that does not decode goes to the dead letters."""
        taken = self.handbacks.take(limit)
        return taken + self.handbacks.reclaim(limit)

    def settle_handbacks(self, taken: Taken[HandBack], again: Sequence[HandBack] = ()) -> None:
        """The hand-backs of ``taken`` were sent on, or are in ``again`` to wait for a member
        that may take them: append ``again`` and acknowledge ``taken``, in one round trip."""
        pipe = self.batch()
        for e in again:
            append(pipe, self.handbacks_key, e.encode())
        self.handbacks.done(taken)
        self.handbacks.flush(pipe)
        execute(pipe, self.handbacks_key)

    def drain_legacy(self, limit: int = 256) -> int:
        """Move what workers of older builds appended to the old lists and the untagged streams
        into the streams; how many entries moved. From the lists, lossy as those were (an entry
        is gone if this process dies between the pop and the append); from the old streams, an
        entry is deleted only once its copy is appended (a router that dies between them leaves
        a duplicate, and acting on a notice twice is harmless). The old streams are in other
        slots, so the deletes are a round trip of their own."""
        pipe = self.batch()
        for key in self.legacy_keys:
            pipe.execute_command("LPOP", key, limit)
        for key in self.legacy_streams:
            pipe.execute_command("XRANGE", key, "-", "+", "COUNT", limit)
        popped = execute(pipe, self.legacy_keys[0])
        targets = (self.notices_key, self.handbacks_key)
        values = [list(vs or ()) for vs in popped[:2]]
        copied: list[list[Any]] = []
        for i, entries in enumerate(popped[2:]):
            copied.append([entry_id for entry_id, _ in entries or ()])
            values[i] += [v for _, fields in entries or () if (v := entry_value(fields))]
        moved = sum(len(vs) for vs in values)
        for stream, vs in zip(targets, values, strict=True):
            for value in vs:
                append(pipe, stream, value)
        if moved:
            execute(pipe, self.notices_key)
            log.warning("moved %d entries of older builds' feed keys into the streams", moved)
        for old, ids in zip(self.legacy_streams, copied, strict=True):
            if ids:
                pipe.execute_command("XDEL", old, *ids)
        if any(copied):
            execute(pipe, self.legacy_streams[0])
        return moved

    # --- cancels -------------------------------------------------------------------------------

    def publish_cancel(self, tenant: str, trajectory_id: str, call_id: str) -> int:
        """Ask every worker to cancel ``call_id`` now; returns how many listeners heard it."""
        body = json.dumps({"tenant": tenant, "trajectory_id": trajectory_id, "call_id": call_id})
        heard: Any = self.client.publish(self.cancel_channel, body)
        return int(heard)

    # --- figures -------------------------------------------------------------------------------

    def admission_figures(self, entry: dict[str, Any]) -> AdmissionRecord:
        """What a script needs to record ``entry`` as :meth:`record_admissions` does: the
        admissions list, the entry as stored there, the most entries the list keeps."""
        return AdmissionRecord(self.admissions_key, json.dumps(entry), STATS_CAP)

    def record_admissions(
        self, entries: Sequence[dict[str, Any]], pipeline: Batch | None = None
    ) -> None:
        """Append admission entries (tenant, charge, whether every tenant had READY work);
        with ``pipeline``, only queued on it."""
        if entries:
            own = pipeline is None
            pipe: Batch = self.client.pipeline(transaction=False) if pipeline is None else pipeline
            pipe.execute_command("RPUSH", self.admissions_key, *(json.dumps(e) for e in entries))
            pipe.execute_command("LTRIM", self.admissions_key, -STATS_CAP, -1)
            if own:
                pipe.execute()

    def admissions(self) -> list[dict[str, Any]]:
        """Every recorded admission entry, oldest first."""
        raw = cast(list[bytes], self.client.lrange(self.admissions_key, 0, -1))
        return [json.loads(r) for r in raw]

    def record_starts(self, delays_ms: Sequence[float]) -> None:
        """Append admission-to-start delays reported by a worker."""
        if delays_ms:
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(self.starts_key, *(f"{d:.3f}" for d in delays_ms))
            pipe.ltrim(self.starts_key, -STATS_CAP, -1)
            pipe.execute()

    def starts(self) -> list[float]:
        """Every reported admission-to-start delay in ms."""
        return [float(r) for r in cast(list[bytes], self.client.lrange(self.starts_key, 0, -1))]


@dataclass
class CancelListener:
    """A worker's subscription to the cancel channel, on its own connection and thread.

    ``on_cancel(call_id)`` runs in the listener thread for every cancel heard. Call ids heard
    in the last ``remember_s`` seconds are kept, so a call whose token opens just after its
    cancel went by is still canceled (:meth:`recently_canceled`). A lost connection (Redis
    restarted, a network fault) is logged and the channel subscribed again on a new one, for as
    long as the listener runs: cancels published meanwhile are missed (pub/sub keeps nothing),
    which the kernel's withdrawal already covers.
    """

    feed: Feed
    on_cancel: Callable[[str], None]
    remember_s: float = 120.0
    resubscribe_s: float = 0.5  # the pause before subscribing again after a failure
    _recent: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    subscribed: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the listener thread; it subscribes at once."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._listen, name="reins-cancels", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and close the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _listen(self) -> None:
        while not self._stop.is_set():
            pubsub: Any = self.feed.client.pubsub(  # type: ignore[no-untyped-call, unused-ignore]
                ignore_subscribe_messages=True
            )
            try:
                pubsub.subscribe(**{self.feed.cancel_channel: self._heard})
                self.subscribed.set()
                while not self._stop.is_set():
                    pubsub.get_message(timeout=0.5)  # runs _heard for a cancel
            except Exception as exc:
                self.subscribed.clear()
                log.warning("cancel listener lost its subscription (%s); subscribing again", exc)
                self._stop.wait(self.resubscribe_s)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def recently_canceled(self, call_id: str) -> bool:
        """True if a cancel for ``call_id`` was heard in the last ``remember_s`` seconds."""
        with self._lock:
            return call_id in self._recent

    def _heard(self, message: dict[str, Any]) -> None:
        try:
            call_id = str(json.loads(message["data"])["call_id"])
        except (ValueError, KeyError, TypeError):
            return  # not a cancel this code wrote; nothing to do
        now = time.monotonic()
        with self._lock:
            self._recent[call_id] = now
            if len(self._recent) > 10_000:
                cutoff = now - self.remember_s
                self._recent = {k: t for k, t in self._recent.items() if t >= cutoff}
        self.on_cancel(call_id)
