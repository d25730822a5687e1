"""The consistent-hash ring that places trajectories on workers.

Pure data, no I/O, and deterministic: positions are xxh64 (seed 0) of the key and of each
member's points, so every process computes the same placement. A member of weight ``w`` owns
``max(1, round(w * points_per_weight))`` points; adding or removing a member moves only the keys
it gains or loses. A draining member takes no new placements (its keys go to the next member
clockwise). A bad change raises a :class:`~kernel.errors.RingError` subclass and leaves the ring
as it was. A change costs the points it adds or drops and the buckets of the lookup index they
land in, not a rebuild (:meth:`Ring.evolved`). Lookups may run in many threads; a ring is never
changed under them (derive a new one and swap the reference). Design:
``docs/adr/0007-ring-and-membership.md``, ``docs/adr/0190-incremental-ring.md``.
"""

from __future__ import annotations

import enum
import json
import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from xxhash import xxh64_hexdigest, xxh64_intdigest

from kernel.errors import (
    DuplicateMember,
    EmptyRing,
    InvalidMemberName,
    InvalidWeight,
    RingError,
    UnknownMember,
)
from router.placement.points import HELD, SLOT_BITS, SLOT_MASK, Batch, PointIndex

RING_FORMAT = "reins-ring-v1/xxh64"
"""Names the point layout; part of every fingerprint, so a layout change can never pass unseen."""

DEFAULT_POINTS_PER_WEIGHT = 4096
"""Points per unit of weight. Measured over 40 random fleets of 20 members (exact arc shares,
largest over mean): 1,600 points gave median 1.046, 90th percentile 1.063; 4,096 gave 1.028 and
1.045. The bucket index keeps lookups as fast at 4,096; the price is memory (8 bytes a point for its
position, 2 for its owner: 1,000 members hold 4.1 M points, ~41 MB) and a first build that hashes
every point; later changes hash only the points they add or drop."""

MAX_NAME_LENGTH = 200
_SPACE = 1 << 64
DEFAULT_INDEX_BITS = 17
"""Buckets of the lookup index, as a power of two (:mod:`router.placement.points`). 2**17 leaves
most buckets empty at 20 members and ~31 points a bucket at 1,000 (a five-step bisect); a
change copies the list of buckets (8 bytes each: ~0.2 ms at 2**17) and the buckets it touches."""

_MAX_MEMBERS = 1 << SLOT_BITS  # a point's owner is a 16-bit slot


class MemberState(enum.StrEnum):
    """Whether a member takes new placements."""

    ACTIVE = "active"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class Member:
    """One worker on the ring: its name, its weight and whether it is draining."""

    name: str
    weight: float = 1.0
    state: MemberState = MemberState.ACTIVE

    @property
    def draining(self) -> bool:
        """True when the member takes no new placements."""
        return self.state == MemberState.DRAINING  # == so a plain "draining" string counts


def key_position(key: str) -> int:
    """The position of ``key`` on the circle: xxh64 of its UTF-8 bytes, seed 0."""
    return xxh64_intdigest(key.encode())


def point_positions(name: str, count: int) -> list[int]:
    """Positions of the first ``count`` points of member ``name``."""
    return _point_range(name, 0, count)


def _point_range(name: str, start: int, stop: int) -> list[int]:
    return [xxh64_intdigest(f"{name}#{i}".encode()) for i in range(start, stop)]


def points_for(weight: float, points_per_weight: int) -> int:
    """How many points a member of ``weight`` owns: proportional, and never none."""
    return max(1, round(weight * points_per_weight))


def check_name(name: object) -> str:
    """Return ``name`` if it can name a member, else raise :class:`InvalidMemberName`."""
    if not isinstance(name, str) or not name:
        raise InvalidMemberName(f"member name must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidMemberName(f"member name {name[:40]!r}... is longer than {MAX_NAME_LENGTH}")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise InvalidMemberName(f"member name {name!r} holds whitespace or unprintable characters")
    return name


def check_weight(name: str, weight: object) -> float:
    """Return ``weight`` as a float if it is finite and positive, else raise InvalidWeight."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise InvalidWeight(f"member {name!r}: weight must be a number, got {weight!r}")
    value = float(weight)
    if not math.isfinite(value) or value <= 0:
        raise InvalidWeight(f"member {name!r}: weight must be positive and finite, got {weight!r}")
    return value


def ring_fingerprint(members: Iterable[Member], points_per_weight: int) -> str:
    """A content hash of a ring: equal iff the members, weights, states and layout are equal.

    Computed from the membership alone, so a replica can tell whether its ring is current
    without building points.
    """
    canonical = [
        [m.name, repr(float(m.weight)), str(m.state)] for m in sorted(members, key=_by_name)
    ]
    text = json.dumps([RING_FORMAT, points_per_weight, canonical], separators=(",", ":"))
    return xxh64_hexdigest(text.encode())


def _by_name(member: Member) -> str:
    return member.name


class Ring:
    """A consistent-hash ring of weighted members with drain; see the module docstring."""

    __slots__ = (
        "_buckets",
        "_fingerprint",
        "_low_mask",
        "_members",
        "_names",
        "_owner_of",
        "_owner_shift",
        "_owners",
        "_points",
        "_slot_of",
        "_width",
        "points_per_weight",
    )

    def __init__(
        self,
        members: Iterable[Member] = (),
        *,
        points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
        index_bits: int | None = None,
    ) -> None:
        """Build a ring; ``index_bits`` fixes the bucket index size (None: the default)."""
        if isinstance(points_per_weight, bool) or points_per_weight < 1:
            raise RingError(f"points_per_weight must be a positive integer: {points_per_weight}")
        if index_bits is not None and not 0 <= index_bits <= 24:
            raise RingError(f"index_bits must be in 0..24, got {index_bits}")
        self.points_per_weight = points_per_weight
        self._members: dict[str, Member] = {}
        self._names: list[str] = []  # slot -> member name ("" for a free slot)
        self._owner_of: list[str | None] = [None]  # slot -> name, None if draining or free
        self._slot_of: dict[str, int] = {}
        self._points = PointIndex.empty(DEFAULT_INDEX_BITS if index_bits is None else index_bits)
        # The index's fields the lookup reads, kept here to save an attribute lookup each.
        self._buckets, self._width = self._points.buckets, self._points.width
        self._low_mask = self._points.low_mask
        self._owners, self._owner_shift = self._points.owners, self._points.owner_shift
        self._fingerprint = ring_fingerprint((), points_per_weight)
        self._apply(_staged(members))

    # --- membership changes: validate, build the new layout, then swap it in -------------------

    def evolved(self, members: Iterable[Member]) -> Ring:
        """A new ring holding exactly ``members``, derived from this one by their difference
        (this ring is left as it was): the same placement as ``Ring(members)``, at the cost of
        the points that differ. Bad input raises as the constructor does."""
        staged = _staged(members, self._members)
        ring = Ring.__new__(Ring)
        for name in Ring.__slots__:
            setattr(ring, name, getattr(self, name))
        ring._apply(staged)
        return ring

    def add(self, name: str, weight: float = 1.0) -> None:
        """Add an active member; refuse a bad name, a bad weight or a name already present."""
        name = check_name(name)
        value = check_weight(name, weight)
        if name in self._members:
            raise DuplicateMember(f"member {name!r} is already on the ring")
        self._apply({**self._members, name: Member(name, value)})

    def remove(self, name: str) -> None:
        """Remove a member and its points; its keys go to their clockwise successors."""
        self._require(name)
        staged = dict(self._members)
        del staged[name]
        self._apply(staged)

    def drain(self, name: str) -> None:
        """Stop new placements on a member while keeping its points. Draining twice is a no-op."""
        member = self._require(name)
        if not member.draining:
            drained = Member(name, member.weight, MemberState.DRAINING)
            self._apply({**self._members, name: drained})

    def set_weight(self, name: str, weight: float) -> None:
        """Change a member's weight: it gains or loses points at the tail of its own list."""
        member = self._require(name)
        value = check_weight(name, weight)
        if value != member.weight:
            self._apply({**self._members, name: Member(name, value, member.state)})

    # --- lookup: the hot path ---------------------------------------------------------------------

    def lookup(self, key: str) -> str:
        """The member that takes ``key``; raises EmptyRing when no member may take new work."""
        position = xxh64_intdigest(key.encode())
        # The owner table first; the arc's bucket only when a point is in the arc. Literals
        # rather than HELD, SLOT_BITS and SLOT_MASK: this is the hot path.
        slot = self._owners[position >> self._owner_shift]
        if slot == 0xFFFF:
            bucket = self._buckets[position >> self._width]
            slot = bucket[bisect_left(bucket, (position & self._low_mask) << 16)] & 0xFFFF
        owner = self._owner_of[slot]
        if owner is None:
            owner = self._past_draining(position)
        return owner

    def lookup_position(self, position: int) -> str:
        """The member that takes a key at ``position`` (0 <= position < 2**64)."""
        if not 0 <= position < _SPACE:
            raise ValueError(f"position {position} is outside 0..2**64-1")
        slot = self._owners[position >> self._owner_shift]
        if slot == HELD:
            bucket = self._buckets[position >> self._width]
            entry = bucket[bisect_left(bucket, (position & self._low_mask) << SLOT_BITS)]
            slot = entry & SLOT_MASK
        owner = self._owner_of[slot]
        if owner is None:
            owner = self._past_draining(position)
        return owner

    def lookup_excluding(self, key: str, exclude: frozenset[str]) -> str:
        """The first member clockwise from ``key`` that may take new work and is not in
        ``exclude`` (members that handed the key's turn back); raises EmptyRing if none.

        With nothing excluded this is :meth:`lookup`; otherwise it walks the points (a rare
        path: a turn handed back because its member cannot read the record)."""
        if not exclude:
            return self.lookup(key)
        self._require_eligible()
        owner_of = self._owner_of
        for slot in self._points.clockwise(xxh64_intdigest(key.encode())):
            owner = owner_of[slot]
            if owner is not None and owner not in exclude:
                return owner
        excluded = ", ".join(sorted(exclude))
        raise EmptyRing(f"every member that may take new work is excluded ({excluded})")

    def _past_draining(self, position: int) -> str:
        """Slow path: the point a key at ``position`` lands on is a draining member's; walk
        clockwise."""
        self._require_eligible()
        owner_of = self._owner_of
        for slot in self._points.clockwise(position):
            owner = owner_of[slot]
            if owner is not None:
                return owner
        raise AssertionError("an eligible member owns no point")  # _require_eligible rules out

    # --- reading the ring ----------------------------------------------------------------------

    @property
    def members(self) -> tuple[Member, ...]:
        """Every member, sorted by name."""
        return tuple(self._members.values())  # kept sorted by _apply

    def member(self, name: str) -> Member:
        """The member called ``name``; raises UnknownMember."""
        return self._require(name)

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __len__(self) -> int:
        return len(self._members)

    @property
    def fingerprint(self) -> str:
        """The ring's content hash (see :func:`ring_fingerprint`)."""
        return self._fingerprint

    @property
    def point_count(self) -> int:
        """How many points are on the ring, draining members' included."""
        return self._points.count

    @property
    def index_shape(self) -> tuple[int, int]:
        """The lookup index's buckets and owner-table arcs (the arcs follow the point count)."""
        return len(self._buckets), len(self._owners)

    def points_of(self, name: str) -> list[int]:
        """Positions of a member's points, in index order (a copy)."""
        member = self._require(name)
        return point_positions(name, points_for(member.weight, self.points_per_weight))

    def shares(self) -> dict[str, float]:
        """Each member's exact fraction of the key space for new placements (draining: 0.0)."""
        arcs = dict.fromkeys(self._members, 0)
        owner_of = self._owner_of
        first: str | None = None  # the first eligible owner from the first point on
        start = previous = -1
        pending = 0  # the arcs since the last eligible point
        for position, slot in self._points.ring_order():
            if previous < 0:
                start = position
            else:
                pending += position - previous
            previous = position
            owner = owner_of[slot]
            if owner is not None:
                first = first or owner
                arcs[owner] += pending
                pending = 0
        if first is not None:  # the arcs past the last eligible point, and the first point's
            arcs[first] += pending + start + _SPACE - previous
        return {name: arc / _SPACE for name, arc in sorted(arcs.items())}

    # --- changing the layout -------------------------------------------------------------------

    def _require(self, name: str) -> Member:
        member = self._members.get(name)
        if member is None:
            known = ", ".join(sorted(self._members)[:10]) or "none"
            raise UnknownMember(f"no member {name!r} on the ring (members: {known})")
        return member

    def _require_eligible(self) -> None:
        if not any(m.state == MemberState.ACTIVE for m in self._members.values()):
            if not self._members:
                raise EmptyRing("the ring has no members: no worker can take the key")
            count = len(self._members)
            raise EmptyRing(f"all {count} members of the ring are draining: no worker can take it")

    def _changes(
        self, members: dict[str, Member]
    ) -> tuple[list[str], dict[str, int], list[_PointRange], list[_PointRange]]:
        """What moving to ``members`` takes: the new slot tables, the points to drop and the
        points to add."""
        per_weight = self.points_per_weight
        names, slot_of = list(self._names), dict(self._slot_of)
        dropped: list[_PointRange] = []
        for name, old in self._members.items():
            had = points_for(old.weight, per_weight)
            keep = points_for(members[name].weight, per_weight) if name in members else 0
            if keep < had:
                dropped.append(_PointRange(slot_of[name], name, keep, had))
            if name not in members:
                names[slot_of.pop(name)] = ""
        free = [slot for slot, name in enumerate(names) if not name]
        free.reverse()
        grown: list[_PointRange] = []
        for name, member in members.items():
            had = points_for(self._members[name].weight, per_weight) if name in slot_of else 0
            wanted = points_for(member.weight, per_weight)
            if name not in slot_of:
                slot_of[name] = free.pop() if free else len(names)
                if slot_of[name] == len(names):
                    names.append(name)
                names[slot_of[name]] = name
            if wanted > had:
                grown.append(_PointRange(slot_of[name], name, had, wanted))
        return names, slot_of, dropped, grown

    def _apply(self, members: dict[str, Member]) -> None:
        """Move this ring to exactly ``members`` (validated) by the points that differ.

        The new index is derived from the current one (which is never changed, so a ring this
        one was derived from keeps its own), then everything is assigned at once.
        """
        if len(members) > _MAX_MEMBERS:
            raise RingError(f"a ring holds at most {_MAX_MEMBERS} members, got {len(members)}")
        names, slot_of, dropped, grown = self._changes(members)
        points = self._points
        if dropped or grown:
            points = points.edited(_hashed(dropped), _hashed(grown), names)
        owner_of: list[str | None] = [None] * max(1, len(names))
        for name, member in members.items():
            if not member.draining:
                owner_of[slot_of[name]] = name
        (
            self._members,
            self._names,
            self._slot_of,
            self._owner_of,
            self._points,
            self._buckets,
            self._owners,
            self._owner_shift,
            self._fingerprint,
        ) = (
            dict(sorted(members.items())),
            names,
            slot_of,
            owner_of,
            points,
            points.buckets,
            points.owners,
            points.owner_shift,
            ring_fingerprint(members.values(), self.points_per_weight),
        )


class _PointRange(NamedTuple):
    """Points ``start`` up to ``stop`` of the member in ``slot``."""

    slot: int
    name: str
    start: int
    stop: int


def _hashed(ranges: list[_PointRange]) -> Iterator[Batch]:
    """Each range's slot and positions, hashed one member at a time."""
    for slot, name, start, stop in ranges:
        yield slot, _point_range(name, start, stop)


def _staged(members: Iterable[Member], known: dict[str, Member] | None = None) -> dict[str, Member]:
    """Validated members by name; raises on a bad name or weight or a name given twice.
    A member equal to its entry in ``known`` (already validated) is taken as it is."""
    staged: dict[str, Member] = {}
    known = known or {}
    for member in members:
        if known.get(member.name) == member and member.name not in staged:
            staged[member.name] = member
            continue
        name = check_name(member.name)
        if name in staged:
            raise DuplicateMember(f"member {name!r} appears twice")
        state = MemberState(member.state)
        staged[name] = Member(name, check_weight(name, member.weight), state)
    return staged
