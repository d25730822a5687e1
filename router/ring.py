"""The consistent-hash ring that places trajectories on workers.

Pure data, no I/O, and deterministic: positions are xxh64 (seed 0) of the key and of each
member's points, so every process computes the same placement. A member of weight ``w`` owns
``max(1, round(w * points_per_weight))`` points; adding or removing a member moves only the keys
it gains or loses. A draining member takes no new placements (its keys go to the next member
clockwise). A bad change raises a :class:`~kernel.errors.RingError` subclass and leaves the ring
as it was. A change costs the points it adds or drops plus one copy of the point arrays, not a
rebuild (:meth:`Ring.evolved`). Lookups may run in many threads; a ring is never changed under
them (derive a new one and swap the reference). Design: ``docs/adr/0007-ring-and-membership.md``,
``docs/adr/0190-incremental-ring.md``.
"""

from __future__ import annotations

import enum
import json
import math
import operator
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate

from xxhash import xxh64_hexdigest, xxh64_intdigest

from kernel.errors import (
    DuplicateMember,
    EmptyRing,
    InvalidMemberName,
    InvalidWeight,
    RingError,
    UnknownMember,
)

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
"""Buckets of the lookup index, as a power of two. Each change passes once over the buckets
(2**16: ~4 ms here, 2**17: ~9, 2**18: ~15); 2**17 leaves most buckets empty at 20 members (a
lookup there skips the bisect) and ~31 points a bucket at 1,000 (a five-step bisect)."""

_MAX_MEMBERS = 1 << 16  # a point's owner is a 16-bit slot
_CHUNK_POINTS = 1 << 18  # a big change is merged in steps of about this many points


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
        "_fingerprint",
        "_index_bits",
        "_members",
        "_names",
        "_owner_of",
        "_positions",
        "_shift",
        "_slot_of",
        "_slots",
        "_starts",
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
        self._index_bits = DEFAULT_INDEX_BITS if index_bits is None else index_bits
        self._shift = 64 - self._index_bits
        self._members: dict[str, Member] = {}
        self._names: list[str] = []  # slot -> member name ("" for a free slot)
        self._owner_of: list[str | None] = [None]  # slot -> name, None if draining or free
        self._slot_of: dict[str, int] = {}
        self._positions = array("Q")  # every point's position, ascending (ties: by name)
        self._slots = array("H", [0])  # each point's member slot, then the wrap entry
        self._starts = array("I", bytes(4 * ((1 << self._index_bits) + 1)))
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
        starts = self._starts
        bucket = position >> self._shift
        lo, hi = starts[bucket], starts[bucket + 1]
        index = lo if lo == hi else bisect_left(self._positions, position, lo, hi)
        owner = self._owner_of[self._slots[index]]
        if owner is None:
            owner = self._past_draining(index)
        return owner

    def lookup_position(self, position: int) -> str:
        """The member that takes a key at ``position`` (0 <= position < 2**64)."""
        if not 0 <= position < _SPACE:
            raise ValueError(f"position {position} is outside 0..2**64-1")
        starts = self._starts
        bucket = position >> self._shift
        index = bisect_left(self._positions, position, starts[bucket], starts[bucket + 1])
        owner = self._owner_of[self._slots[index]]
        if owner is None:
            owner = self._past_draining(index)
        return owner

    def lookup_excluding(self, key: str, exclude: frozenset[str]) -> str:
        """The first member clockwise from ``key`` that may take new work and is not in
        ``exclude`` (members that handed the key's turn back); raises EmptyRing if none.

        With nothing excluded this is :meth:`lookup`; otherwise it walks the points (a rare
        path: a turn handed back because its member cannot read the record)."""
        if not exclude:
            return self.lookup(key)
        self._require_eligible()
        start = bisect_left(self._positions, xxh64_intdigest(key.encode()))
        count = len(self._positions)
        owner_of, slots = self._owner_of, self._slots
        for i in range(start, start + count):
            owner = owner_of[slots[i % count]]
            if owner is not None and owner not in exclude:
                return owner
        excluded = ", ".join(sorted(exclude))
        raise EmptyRing(f"every member that may take new work is excluded ({excluded})")

    def _past_draining(self, index: int) -> str:
        """Slow path: the point at ``index`` is a draining member's; walk clockwise."""
        self._require_eligible()
        count = len(self._positions)
        owner_of, slots = self._owner_of, self._slots
        for i in range(index + 1, index + 1 + count):
            owner = owner_of[slots[i % count]]
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
        return len(self._positions)

    def points_of(self, name: str) -> list[int]:
        """Positions of a member's points, in index order (a copy)."""
        member = self._require(name)
        return point_positions(name, points_for(member.weight, self.points_per_weight))

    def shares(self) -> dict[str, float]:
        """Each member's exact fraction of the key space for new placements (draining: 0.0)."""
        arcs = dict.fromkeys(self._members, 0)
        positions, slots, owner_of = self._positions, self._slots, self._owner_of
        count = len(positions)
        if any(owner is not None for owner in owner_of):
            following: str | None = None
            # Backwards round the circle twice: the first lap finds who follows the last points.
            for i in range(2 * count - 1, -1, -1):
                following = owner_of[slots[i % count]] or following
                if i < count and following is not None:
                    previous = positions[i - 1] - (_SPACE if i == 0 else 0)
                    arcs[following] += positions[i] - previous
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
    ) -> tuple[list[str], dict[str, int], list[tuple[int, str, int]], list[tuple[str, int, int]]]:
        """What moving to ``members`` takes: the new slot tables, the points to drop (position,
        name, slot) and each member's range of new point indices (name, start, stop)."""
        per_weight = self.points_per_weight
        names, slot_of = list(self._names), dict(self._slot_of)
        dropped: list[tuple[int, str, int]] = []
        for name, old in self._members.items():
            had = points_for(old.weight, per_weight)
            keep = points_for(members[name].weight, per_weight) if name in members else 0
            if keep < had:
                slot = slot_of[name]
                dropped.extend((p, name, slot) for p in _point_range(name, keep, had))
            if name not in members:
                names[slot_of.pop(name)] = ""
        free = [slot for slot, name in enumerate(names) if not name]
        free.reverse()
        grown: list[tuple[str, int, int]] = []  # (name, first new point, stop)
        for name, member in members.items():
            had = points_for(self._members[name].weight, per_weight) if name in slot_of else 0
            wanted = points_for(member.weight, per_weight)
            if name not in slot_of:
                slot_of[name] = free.pop() if free else len(names)
                if slot_of[name] == len(names):
                    names.append(name)
                names[slot_of[name]] = name
            if wanted > had:
                grown.append((name, had, wanted))
        return names, slot_of, dropped, grown

    def _apply(self, members: dict[str, Member]) -> None:
        """Move this ring to exactly ``members`` (validated) by the points that differ.

        Everything is built in locals from the current arrays (never changed in place, so a
        ring this one was derived from keeps its own), then assigned at once.
        """
        if len(members) > _MAX_MEMBERS:
            raise RingError(f"a ring holds at most {_MAX_MEMBERS} members, got {len(members)}")
        names, slot_of, dropped, grown = self._changes(members)
        positions, slots, starts = self._positions, self._slots, self._starts
        if dropped:
            dropped.sort()
            positions, slots = _cut((positions, slots, starts, self._shift), dropped)
            starts = _moved_starts(starts, [p for p, _, _ in dropped], self._shift, -1)
        for chunk in _chunks(grown):
            added = _sorted_points(chunk, slot_of)
            positions, slots = _merge((positions, slots, starts, self._shift), names, added)
            starts = _moved_starts(starts, [p >> 16 for p in added], self._shift, +1)
        slots[-1] = slots[0] if positions else 0  # a key past the last point wraps to the first
        owner_of: list[str | None] = [None] * max(1, len(names))
        for name, member in members.items():
            if not member.draining:
                owner_of[slot_of[name]] = name
        (
            self._members,
            self._names,
            self._slot_of,
            self._owner_of,
            self._positions,
            self._slots,
            self._starts,
            self._fingerprint,
        ) = (
            dict(sorted(members.items())),
            names,
            slot_of,
            owner_of,
            positions,
            slots,
            starts,
            ring_fingerprint(members.values(), self.points_per_weight),
        )


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


def _chunks(grown: list[tuple[str, int, int]]) -> Iterable[list[tuple[str, int, int]]]:
    """Members' new point ranges in groups of about ``_CHUNK_POINTS`` points, so a first build
    never holds millions of Python ints at once."""
    chunk: list[tuple[str, int, int]] = []
    size = 0
    for entry in grown:
        chunk.append(entry)
        size += entry[2] - entry[1]
        if size >= _CHUNK_POINTS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _sorted_points(chunk: list[tuple[str, int, int]], slot_of: dict[str, int]) -> list[int]:
    """The chunk's new points in ring order, each packed as ``position << 16 | slot``.

    Sorted as plain ints (much faster than tuples); a tie on a position goes to the smaller
    name because the slots are packed in name order here and unpacked to real slots after."""
    order = sorted(name for name, _, _ in chunk)
    rank = {name: i for i, name in enumerate(order)}
    packed = sorted(
        (p << 16) | rank[name] for name, a, b in chunk for p in _point_range(name, a, b)
    )
    real = [slot_of[name] for name in order]
    return [(v & ~0xFFFF) | real[v & 0xFFFF] for v in packed]


def _merge(
    ring: tuple[array[int], array[int], array[int], int],
    names: list[str],
    added: list[int],
) -> tuple[array[int], array[int]]:
    """The ``(positions, slots, starts, shift)`` ring's points with the sorted ``added`` points
    (packed as by :func:`_sorted_points`) inserted in ring order: by position, ties by member
    name. Runs of old points are copied
    whole into arrays sized once; the Python work is per new point."""
    positions, slots, starts, shift = ring
    count = len(positions)
    out_p, out_s = (
        array("Q", [0]) * (count + len(added)),
        array("H", [0]) * (count + len(added) + 1),
    )
    raw_p, raw_s = memoryview(positions).cast("B"), memoryview(slots).cast("B")
    to_p, to_s = memoryview(out_p).cast("B"), memoryview(out_s).cast("B")
    done = at = 0  # old points copied, points written
    for packed in added:
        position, slot = packed >> 16, packed & 0xFFFF
        bucket = position >> shift
        lo = starts[bucket]
        i = bisect_left(positions, position, lo if lo > done else done, starts[bucket + 1])
        while i < count and positions[i] == position and names[slots[i]] < names[slot]:
            i += 1
        run = i - done
        to_p[8 * at : 8 * (at + run)] = raw_p[8 * done : 8 * i]
        to_s[2 * at : 2 * (at + run)] = raw_s[2 * done : 2 * i]
        at, done = at + run, i
        out_p[at] = position
        out_s[at] = slot
        at += 1
    to_p[8 * at :] = raw_p[8 * done :]
    to_s[2 * at : -2] = raw_s[2 * done : -2]  # the wrap entry is set by the caller
    return out_p, out_s


def _cut(
    ring: tuple[array[int], array[int], array[int], int], dropped: list[tuple[int, str, int]]
) -> tuple[array[int], array[int]]:
    """The ``(positions, slots, starts, shift)`` ring's points without the ``dropped`` ones
    (sorted in ring order)."""
    positions, slots, starts, shift = ring
    count = len(positions) - len(dropped)
    out_p, out_s = array("Q", [0]) * count, array("H", [0]) * (count + 1)
    raw_p, raw_s = memoryview(positions).cast("B"), memoryview(slots).cast("B")
    to_p, to_s = memoryview(out_p).cast("B"), memoryview(out_s).cast("B")
    done = at = 0
    for position, _, slot in dropped:
        bucket = position >> shift
        i = bisect_left(positions, position, max(done, starts[bucket]), starts[bucket + 1])
        while slots[i] != slot:  # a tie on the position: the point is further on
            i += 1
        run = i - done
        to_p[8 * at : 8 * (at + run)] = raw_p[8 * done : 8 * i]
        to_s[2 * at : 2 * (at + run)] = raw_s[2 * done : 2 * i]
        at, done = at + run, i + 1
    to_p[8 * at :] = raw_p[8 * done :]
    to_s[2 * at : -2] = raw_s[2 * done : -2]  # the wrap entry is set by the caller
    return out_p, out_s


def _moved_starts(starts: array[int], changed: list[int], shift: int, sign: int) -> array[int]:
    """The bucket index after adding (``sign`` +1) or dropping (-1) points at ``changed``:
    ``starts[b]`` is the index of the first point in bucket ``b`` or after it."""
    delta = [0] * len(starts)
    for position in changed:
        delta[(position >> shift) + 1] += sign
    return array("I", map(operator.add, starts, accumulate(delta)))
