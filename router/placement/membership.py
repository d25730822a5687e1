"""Ring membership in Redis: workers register and heartbeat, operators drain and remove.

Keys (under the key prefix; two keys, no multi-key operation, so Redis Cluster is fine):

``<prefix>:ring:members``  one hash holding every member's entry:
    ``w:<name>``  weight; its presence is what "registered" means
    ``hb:<name>`` time of the last heartbeat, in seconds
    ``i:<name>``  the incarnation (one id per process) that registered last
    ``p:<name>``  its consumer's progress: ``taken:finished:queued:moved_at``
    ``d:<name>``  present while the member is draining (the drain flag lives beside the weight)
``<prefix>:ring:replicas`` one hash, replica id -> JSON report of the ring that replica built:
    its fingerprint, which members it places new work on, which it drains, when it published.

A member whose heartbeat is older than ``heartbeat_timeout_s`` is lapsed, and one whose queue has
work while its progress has not moved for ``stall_timeout_s`` is stalled; either is not live (left
out of the ring, and its turns are recovered); a drain is acknowledged once no live replica's
published ring places new work on the member. Heartbeat and drain write only while the member is
registered; removal deletes the whole entry at once. A member with no heartbeat for
``retention_s`` is deleted (:meth:`Membership.prune`; pod names are not reused, so a lapsed one
would stay listed for ever). Bad input raises a RingError subclass and writes nothing. Time is
Redis's ``TIME`` unless a clock is injected. Design: ``docs/adr/0007-ring-and-membership.md``,
``docs/adr/0190-incremental-ring.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis

from kernel.errors import StoreError, UnknownMember
from kernel.settings import Settings
from router.placement.ring import (
    DEFAULT_POINTS_PER_WEIGHT,
    Member,
    MemberState,
    Ring,
    check_name,
    check_weight,
    ring_fingerprint,
)
from store.redis_client import text
from store.scripts import scripts_beside

Clock = Callable[[], float]

_WEIGHT, _HEARTBEAT, _DRAIN, _INCARNATION, _PROGRESS = "w:", "hb:", "d:", "i:", "p:"
# Beside this module rather than via importlib.resources: an editable install can present
# ``router`` as a namespace package, which importlib.resources refuses.
SCRIPTS = scripts_beside(__file__)


@dataclass(frozen=True, slots=True)
class Progress:
    """What a member's consumer has done: messages taken, turns finished, and how many
    messages its queue held when it last looked."""

    taken: int = 0
    finished: int = 0
    queued: int = 0

    def moved(self, other: Progress) -> bool:
        """True when the consumer did something since ``other``."""
        return (self.taken, self.finished) != (other.taken, other.finished)


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A registered member as Redis holds it, with whether it is live (heartbeat current, and
    not stalled: work in its queue while its progress stands still)."""

    name: str
    weight: float
    heartbeat_at: float
    draining: bool
    live: bool
    incarnation: str = ""
    progress: Progress = Progress()
    progress_moved_at: float = float("-inf")
    stalled: bool = False

    def as_member(self) -> Member:
        """The ring member this record stands for."""
        state = MemberState.DRAINING if self.draining else MemberState.ACTIVE
        return Member(self.name, self.weight, state)


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """What one router replica last published about the ring it built."""

    replica_id: str
    fingerprint: str
    active: frozenset[str]
    draining: frozenset[str]
    published_at: float
    live: bool


@dataclass(frozen=True, slots=True)
class DrainStatus:
    """Whether every live replica has stopped placing new work on a member."""

    member: str
    acknowledged: bool
    live_replicas: tuple[str, ...]
    pending: tuple[str, ...]  # live replicas whose ring still places new work on the member


class Membership:
    """Ring membership under one key prefix; see the module docstring for the contracts."""

    def __init__(
        self,
        client: redis.Redis,
        key_prefix: str,
        *,
        heartbeat_timeout_s: float = 5.0,
        stall_timeout_s: float = float("inf"),
        clock: Clock | None = None,
        points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
        retention_s: float = float("inf"),
    ) -> None:
        """Bind to ``client`` under ``key_prefix``; nothing is read or written until asked."""
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be positive, got {heartbeat_timeout_s}")
        if not retention_s > heartbeat_timeout_s:
            raise ValueError(
                f"retention_s ({retention_s}) must be above heartbeat_timeout_s "
                f"({heartbeat_timeout_s})"
            )
        self.retention_s = retention_s
        self._client = client
        self.members_key = f"{key_prefix}:ring:members"
        self.replicas_key = f"{key_prefix}:ring:replicas"
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._moved: dict[str, tuple[Progress, float]] = {}  # this process's own members
        self.points_per_weight = points_per_weight
        self._clock: Clock = clock if clock is not None else self._redis_time
        self._set_if_member = SCRIPTS("set_if_member.lua")
        self._prune = SCRIPTS("prune_members.lua")

    # --- writes --------------------------------------------------------------------------------

    @classmethod
    def of(cls, client: redis.Redis, settings: Settings) -> Membership:
        """The membership of the deployment ``settings`` name, with its liveness bounds."""
        return cls(
            client,
            settings.key_prefix,
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            stall_timeout_s=settings.stall_timeout_s,
            retention_s=settings.member_retention_s,
        )

    def register(self, name: str, weight: float = 1.0, incarnation: str = "") -> None:
        """Register (or re-register) a member with a weight, a fresh heartbeat, its incarnation
        and no progress yet, atomically."""
        name = check_name(name)
        value = check_weight(name, weight)
        now = self._clock()
        self._moved[name] = (Progress(), now)
        fields: dict[Any, Any] = {  # redis-py types its mapping keys invariantly
            _WEIGHT + name: repr(value),
            _HEARTBEAT + name: repr(now),
            _PROGRESS + name: _progress_text(Progress(), now),
        }
        if incarnation:
            fields[_INCARNATION + name] = incarnation
        self._client.hset(self.members_key, mapping=fields)

    def heartbeat(self, name: str, progress: Progress | None = None) -> None:
        """Record that ``name`` is alive now, with its consumer's ``progress`` when given;
        raises UnknownMember if it is not registered."""
        now = self._clock()
        if progress is None:
            self._set_fields(name, {_HEARTBEAT + name: repr(now)})
            return
        last, moved_at = self._moved.get(name, (progress, now))
        if progress.moved(last) or name not in self._moved:
            moved_at = now
        self._moved[name] = (progress, moved_at)
        fields = {
            _HEARTBEAT + name: repr(now),
            _PROGRESS + name: _progress_text(progress, moved_at),
        }
        self._set_fields(name, fields)

    def incarnation(self, name: str) -> str | None:
        """The incarnation that registered ``name`` last, or None (never, or removed)."""
        found = self._client.hget(self.members_key, _INCARNATION + check_name(name))
        return None if found is None else text(found)

    def drain(self, name: str) -> None:
        """Flag ``name`` as draining; raises UnknownMember if it is not registered."""
        self._set_fields(name, {_DRAIN + name: "1"})

    def remove(self, name: str) -> None:
        """Delete a member's whole entry in one transaction; raises UnknownMember if absent."""
        check_name(name)
        pipe = self._client.pipeline(transaction=True)
        pipe.hexists(self.members_key, _WEIGHT + name)
        fields = (_WEIGHT, _HEARTBEAT, _DRAIN, _INCARNATION, _PROGRESS)
        pipe.hdel(self.members_key, *(f + name for f in fields))
        existed, _ = pipe.execute()
        if not existed:
            raise self._unknown(name)

    def prune(self, records: Iterable[MemberRecord] | None = None) -> tuple[str, ...]:
        """Delete every member whose last heartbeat is more than ``retention_s`` old; returns
        their names. ``records`` (read a moment ago, or now if None) only nominates: each is
        checked again atomically, so a heartbeat landing in between keeps its member."""
        now = self._clock()
        listed = self.records() if records is None else records
        stale = [r.name for r in listed if now - r.heartbeat_at > self.retention_s]
        if not stale:
            return ()
        args = [repr(now - self.retention_s), *stale]
        removed = self._prune.run(self._client, [self.members_key], args)
        for name in removed:
            self._moved.pop(text(name), None)
        return tuple(text(name) for name in removed)

    def publish(self, replica_id: str, ring: Ring) -> None:
        """Publish the ring replica ``replica_id`` built; doubles as that replica's heartbeat."""
        check_name(replica_id)
        report = {
            "fingerprint": ring.fingerprint,
            "active": [m.name for m in ring.members if not m.draining],
            "draining": [m.name for m in ring.members if m.draining],
            "at": self._clock(),
        }
        self._client.hset(self.replicas_key, replica_id, json.dumps(report, sort_keys=True))

    def retire(self, replica_id: str) -> None:
        """Withdraw a replica's report (a clean shutdown); unknown ids are ignored."""
        self._client.hdel(self.replicas_key, replica_id)

    # --- reads ---------------------------------------------------------------------------------

    def records(self) -> tuple[MemberRecord, ...]:
        """Every registered member, sorted by name, each marked live or lapsed as of now."""
        fields = _Fields.parse(self.members_key, self._hgetall(self.members_key))
        now = self._clock()
        return tuple(self._record(fields, name, now) for name in sorted(fields.weights))

    def _record(self, f: _Fields, name: str, now: float) -> MemberRecord:
        beat = f.beats.get(name, float("-inf"))
        progress, moved_at = f.progress.get(name, (Progress(), float("-inf")))
        stalled = progress.queued > 0 and now - moved_at > self.stall_timeout_s
        return MemberRecord(
            name=name,
            weight=f.weights[name],
            heartbeat_at=beat,
            draining=name in f.draining,
            live=now - beat <= self.heartbeat_timeout_s and not stalled,
            incarnation=f.incarnations.get(name, ""),
            progress=progress,
            progress_moved_at=moved_at,
            stalled=stalled,
        )

    def live_members(self) -> tuple[Member, ...]:
        """The members a ring is built from: registered and not lapsed."""
        return tuple(r.as_member() for r in self.records() if r.live)

    def build_ring(self) -> Ring:
        """The ring every replica builds from the current membership."""
        return Ring(self.live_members(), points_per_weight=self.points_per_weight)

    def replicas(self) -> tuple[ReplicaReport, ...]:
        """Every replica's last report, sorted by id, each marked live or not as of now."""
        raw = self._hgetall(self.replicas_key)
        now = self._clock()
        reports = []
        for replica_id in sorted(raw):
            try:
                data = json.loads(raw[replica_id])
                at = float(data["at"])
                report = ReplicaReport(
                    replica_id=replica_id,
                    fingerprint=str(data["fingerprint"]),
                    active=frozenset(data["active"]),
                    draining=frozenset(data["draining"]),
                    published_at=at,
                    live=now - at <= self.heartbeat_timeout_s,
                )
            except (ValueError, KeyError, TypeError) as exc:
                bad = f"{self.replicas_key}: report of {replica_id!r} is bad: {exc}"
                raise StoreError(bad) from None
            reports.append(report)
        return tuple(reports)

    def is_draining(self, name: str) -> bool:
        """Whether ``name`` carries the drain flag (False for an unknown member)."""
        return bool(self._client.hexists(self.members_key, _DRAIN + check_name(name)))

    def drain_status(self, name: str) -> DrainStatus:
        """Whether the drain of ``name`` has reached every live replica (module contract)."""
        check_name(name)
        if not self._client.hexists(self.members_key, _WEIGHT + name):
            raise self._unknown(name)
        live = [r for r in self.replicas() if r.live]
        pending = tuple(r.replica_id for r in live if name in r.active)
        return DrainStatus(
            member=name,
            acknowledged=bool(live) and not pending,
            live_replicas=tuple(r.replica_id for r in live),
            pending=pending,
        )

    # --- helpers -------------------------------------------------------------------------------

    def _set_fields(self, name: str, fields: dict[str, str]) -> None:
        check_name(name)
        args = [_WEIGHT + name, *(x for pair in fields.items() for x in pair)]
        written = self._set_if_member.run(self._client, [self.members_key], args)
        if not written:
            raise self._unknown(name)

    def _unknown(self, name: str) -> UnknownMember:
        known = sorted(self._names())
        listed = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "") or "none"
        return UnknownMember(f"no member {name!r} is registered (members: {listed})")

    def _names(self) -> Iterable[str]:
        for field in self._hgetall(self.members_key):
            if field.startswith(_WEIGHT):
                yield field[len(_WEIGHT) :]

    def _hgetall(self, key: str) -> dict[str, str]:
        raw = cast(dict[Any, Any], self._client.hgetall(key))
        return {text(k): text(v) for k, v in raw.items()}

    def _redis_time(self) -> float:
        seconds, micros = self._client.time()
        return seconds + micros / 1_000_000


def _progress_text(progress: Progress, moved_at: float) -> str:
    return f"{progress.taken}:{progress.finished}:{progress.queued}:{moved_at!r}"


@dataclass
class _Fields:
    """The membership hash's fields, by kind and member."""

    weights: dict[str, float]
    beats: dict[str, float]
    draining: set[str]
    incarnations: dict[str, str]
    progress: dict[str, tuple[Progress, float]]

    @classmethod
    def parse(cls, key: str, raw: dict[str, str]) -> _Fields:
        """Read every field; a number that is not one raises :class:`StoreError` naming it."""
        out = cls({}, {}, set(), {}, {})
        for field, value in raw.items():
            kind, _, name = field.partition(":")
            try:
                out.add(kind, name, value)
            except ValueError:
                raise StoreError(f"{key}: field {field!r} holds {value!r}, not a number") from None
        return out

    def add(self, kind: str, name: str, value: str) -> None:
        """One field (unknown kinds are ignored: a newer build may add some)."""
        if kind == "w":
            self.weights[name] = float(value)
        elif kind == "hb":
            self.beats[name] = float(value)
        elif kind == "d":
            self.draining.add(name)
        elif kind == "i":
            self.incarnations[name] = value
        elif kind == "p":
            taken, finished, queued, moved_at = value.split(":", 3)
            self.progress[name] = (
                Progress(int(taken), int(finished), int(queued)),
                float(moved_at),
            )


class ReplicaRing:
    """One router replica's ring: rebuilt only when the membership changes, always published."""

    def __init__(self, membership: Membership, replica_id: str) -> None:
        """Bind to a membership; call :meth:`refresh` to build the first ring."""
        self.membership = membership
        self.replica_id = check_name(replica_id)
        self._ring: Ring | None = None

    @property
    def ring(self) -> Ring:
        """The ring as of the last refresh (an empty ring before the first)."""
        if self._ring is None:
            return Ring(points_per_weight=self.membership.points_per_weight)
        return self._ring

    def refresh(self) -> Ring:
        """Read the membership, delete members past their retention, move the ring to the live
        members if its fingerprint changed, and publish it.

        A change is applied by its difference (:meth:`Ring.evolved`: the points of the members
        that changed), so a join or a leave in a large fleet does not rebuild the whole ring."""
        records = self.membership.records()
        self.membership.prune(records)
        members = tuple(r.as_member() for r in records if r.live)
        per_weight = self.membership.points_per_weight
        fingerprint = ring_fingerprint(members, per_weight)
        if self._ring is None:
            self._ring = Ring(members, points_per_weight=per_weight)
        elif self._ring.fingerprint != fingerprint:
            self._ring = self._ring.evolved(members)
        self.membership.publish(self.replica_id, self._ring)
        return self._ring
