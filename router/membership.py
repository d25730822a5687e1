"""Ring membership in Redis: workers register and heartbeat, operators drain and remove.

Keys (under the key prefix; two keys, no multi-key operation, so Redis Cluster is fine):

``<prefix>:ring:members``  one hash holding every member's entry:
    ``w:<name>``  weight; its presence is what "registered" means
    ``hb:<name>`` time of the last heartbeat, in seconds
    ``d:<name>``  present while the member is draining (the drain flag lives beside the weight)
``<prefix>:ring:replicas`` one hash, replica id -> JSON report of the ring that replica built:
    its fingerprint, which members it places new work on, which it drains, when it published.

A member whose heartbeat is older than ``heartbeat_timeout_s`` is lapsed (left out of the
ring); a drain is acknowledged once no live replica's published ring places new work on the
member. Heartbeat and drain write only while the member is registered; removal deletes the
whole entry at once. Bad input raises a RingError subclass and writes nothing. Time is Redis's
``TIME`` unless a clock is injected. Design: ``docs/adr/0007-ring-and-membership.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import redis

from kernel.errors import StoreError, UnknownMember
from router.ring import (
    DEFAULT_POINTS_PER_WEIGHT,
    Member,
    MemberState,
    Ring,
    check_name,
    check_weight,
    ring_fingerprint,
)
from store.redis_client import text

Clock = Callable[[], float]

_WEIGHT, _HEARTBEAT, _DRAIN = "w:", "hb:", "d:"
# Beside this module rather than via importlib.resources: an editable install can present
# ``router`` as a namespace package, which importlib.resources refuses.
_SET_IF_MEMBER = Path(__file__).with_name("set_if_member.lua")


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A registered member as Redis holds it, with whether its heartbeat is current."""

    name: str
    weight: float
    heartbeat_at: float
    draining: bool
    live: bool

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
        clock: Clock | None = None,
        points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
    ) -> None:
        """Bind to ``client`` under ``key_prefix``; nothing is read or written until asked."""
        if not key_prefix:
            raise ValueError("key_prefix must not be empty")
        if heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be positive, got {heartbeat_timeout_s}")
        self._client = client
        self.members_key = f"{key_prefix}:ring:members"
        self.replicas_key = f"{key_prefix}:ring:replicas"
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.points_per_weight = points_per_weight
        self._clock: Clock = clock if clock is not None else self._redis_time
        self._set_if_member = client.register_script(_SET_IF_MEMBER.read_text())

    # --- writes --------------------------------------------------------------------------------

    def register(self, name: str, weight: float = 1.0) -> None:
        """Register (or re-register) a member with a weight and a fresh heartbeat, atomically."""
        name = check_name(name)
        value = check_weight(name, weight)
        now = self._clock()
        self._client.hset(
            self.members_key,
            mapping={_WEIGHT + name: repr(value), _HEARTBEAT + name: repr(now)},
        )

    def heartbeat(self, name: str) -> None:
        """Record that ``name`` is alive now; raises UnknownMember if it is not registered."""
        self._set_field(name, _HEARTBEAT + name, repr(self._clock()))

    def drain(self, name: str) -> None:
        """Flag ``name`` as draining; raises UnknownMember if it is not registered."""
        self._set_field(name, _DRAIN + name, "1")

    def remove(self, name: str) -> None:
        """Delete a member's whole entry in one transaction; raises UnknownMember if absent."""
        check_name(name)
        pipe = self._client.pipeline(transaction=True)
        pipe.hexists(self.members_key, _WEIGHT + name)
        pipe.hdel(self.members_key, _WEIGHT + name, _HEARTBEAT + name, _DRAIN + name)
        existed, _ = pipe.execute()
        if not existed:
            raise self._unknown(name)

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
        raw = self._hgetall(self.members_key)
        now = self._clock()
        weights: dict[str, float] = {}
        beats: dict[str, float] = {}
        draining: set[str] = set()
        for field, value in raw.items():
            kind, _, name = field.partition(":")
            try:
                if kind == "w":
                    weights[name] = float(value)
                elif kind == "hb":
                    beats[name] = float(value)
                elif kind == "d":
                    draining.add(name)
            except ValueError:
                raise StoreError(
                    f"{self.members_key}: field {field!r} holds {value!r}, not a number"
                ) from None
        return tuple(
            MemberRecord(
                name=name,
                weight=weights[name],
                heartbeat_at=beats.get(name, float("-inf")),
                draining=name in draining,
                live=now - beats.get(name, float("-inf")) <= self.heartbeat_timeout_s,
            )
            for name in sorted(weights)
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

    def _set_field(self, name: str, field: str, value: str) -> None:
        check_name(name)
        written = self._set_if_member(keys=[self.members_key], args=[_WEIGHT + name, field, value])
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
        """Read the membership, rebuild the ring if its fingerprint changed, and publish it."""
        members = self.membership.live_members()
        fingerprint = ring_fingerprint(members, self.membership.points_per_weight)
        if self._ring is None or self._ring.fingerprint != fingerprint:
            self._ring = Ring(members, points_per_weight=self.membership.points_per_weight)
        self.membership.publish(self.replica_id, self._ring)
        return self._ring
