"""The consistent-hash ring that places trajectories on workers.

Pure data, no I/O, and deterministic: positions are xxh64 (seed 0) of the key and of each
member's points, so every process computes the same placement. A member of weight ``w`` owns
``max(1, round(w * points_per_weight))`` points; adding or removing a member moves only the keys
it gains or loses. A draining member takes no new placements (its keys go to the next member
clockwise). A bad change raises a :class:`~kernel.errors.RingError` subclass and leaves the ring
as it was. Lookups may run in many threads; a ring is never changed under them (build a new one
and swap the reference). Design: ``docs/adr/0007-ring-and-membership.md``.
"""

from __future__ import annotations

import bisect
import enum
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

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
1.045. The bucket index keeps lookups as fast at 4,096; the price is build time and memory
(20 members: 81,920 points, ~0.3 s to build here, ~25 MB), paid only when membership changes."""

MAX_NAME_LENGTH = 200
_SPACE = 1 << 64
_BUCKETS_PER_POINT_LOG2 = 3  # 8-16 buckets a point: 20 members at 4,096 -> 92% hold no point
_MAX_INDEX_BITS = 20  # caps the index at 2**20 entries (8 MiB of references)
_MAX_MEMBERS = 1 << 16  # the build packs a member's rank into 16 bits beside each position


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
        "_eligible",
        "_fingerprint",
        "_index_bits",
        "_members",
        "_owners",
        "_points",
        "_positions",
        "_shift",
        "_spans",
        "_table",
        "points_per_weight",
    )

    def __init__(
        self,
        members: Iterable[Member] = (),
        *,
        points_per_weight: int = DEFAULT_POINTS_PER_WEIGHT,
        index_bits: int | None = None,
    ) -> None:
        """Build a ring; ``index_bits`` fixes the bucket index size (None: sized by points)."""
        if isinstance(points_per_weight, bool) or points_per_weight < 1:
            raise RingError(f"points_per_weight must be a positive integer: {points_per_weight}")
        if index_bits is not None and not 0 <= index_bits <= 24:
            raise RingError(f"index_bits must be in 0..24, got {index_bits}")
        self.points_per_weight = points_per_weight
        self._index_bits = index_bits
        self._members: dict[str, Member] = {}
        self._points: dict[str, list[int]] = {}
        staged: dict[str, Member] = {}
        for member in members:
            name = check_name(member.name)
            if name in staged:
                raise DuplicateMember(f"member {name!r} appears twice")
            state = MemberState(member.state)
            staged[name] = Member(name, check_weight(name, member.weight), state)
        self._install(staged)

    # --- membership changes: validate, build the new layout, then swap it in -------------------

    def add(self, name: str, weight: float = 1.0) -> None:
        """Add an active member; refuse a bad name, a bad weight or a name already present."""
        name = check_name(name)
        value = check_weight(name, weight)
        if name in self._members:
            raise DuplicateMember(f"member {name!r} is already on the ring")
        self._install({**self._members, name: Member(name, value)})

    def remove(self, name: str) -> None:
        """Remove a member and its points; its keys go to their clockwise successors."""
        self._require(name)
        staged = dict(self._members)
        del staged[name]
        self._install(staged)

    def drain(self, name: str) -> None:
        """Stop new placements on a member while keeping its points. Draining twice is a no-op."""
        member = self._require(name)
        if not member.draining:
            drained = Member(name, member.weight, MemberState.DRAINING)
            self._install({**self._members, name: drained})

    def set_weight(self, name: str, weight: float) -> None:
        """Change a member's weight: it gains or loses points at the tail of its own list."""
        member = self._require(name)
        value = check_weight(name, weight)
        if value != member.weight:
            self._install({**self._members, name: Member(name, value, member.state)})

    # --- lookup: the hot path ---------------------------------------------------------------------

    def lookup(self, key: str) -> str:
        """The member that takes ``key``; raises EmptyRing when no member may take new work."""
        position = xxh64_intdigest(key.encode())
        owner = self._table[position >> self._shift]
        if owner is None:
            owner = self._resolve(position)
        return owner

    def lookup_position(self, position: int) -> str:
        """The member that takes a key at ``position`` (0 <= position < 2**64)."""
        if not 0 <= position < _SPACE:
            raise ValueError(f"position {position} is outside 0..2**64-1")
        owner = self._table[position >> self._shift]
        if owner is None:
            owner = self._resolve(position)
        return owner

    def lookup_excluding(self, key: str, exclude: frozenset[str]) -> str:
        """The first member clockwise from ``key`` that may take new work and is not in
        ``exclude`` (members that handed the key's turn back); raises EmptyRing if none.

        With nothing excluded this is :meth:`lookup`; otherwise it walks the points (a rare
        path: a turn handed back because its member cannot read the record)."""
        if not exclude:
            return self.lookup(key)
        if not self._eligible:
            raise EmptyRing(self._why_empty())
        start = bisect.bisect_left(self._positions, xxh64_intdigest(key.encode()))
        count = len(self._positions)
        for i in range(start, start + count):
            owner = self._owners[i % count]
            if owner not in exclude:
                return owner
        excluded = ", ".join(sorted(exclude))
        raise EmptyRing(f"every member that may take new work is excluded ({excluded})")

    def _resolve(self, position: int) -> str:
        """Slow path: the bucket holds points (or the ring cannot place anything)."""
        if not self._eligible:
            raise EmptyRing(self._why_empty())
        first, stop = self._spans[position >> self._shift]
        # The answer is a point of this bucket, or the first point after it (index ``stop``).
        return self._owners[bisect.bisect_left(self._positions, position, first, stop)]

    # --- reading the ring ----------------------------------------------------------------------

    @property
    def members(self) -> tuple[Member, ...]:
        """Every member, sorted by name."""
        return tuple(self._members.values())  # kept sorted by _install

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
        self._require(name)
        return list(self._points[name])

    def shares(self) -> dict[str, float]:
        """Each member's exact fraction of the key space for new placements (draining: 0.0)."""
        arcs = dict.fromkeys(self._members, 0)
        positions, owners = self._positions, self._owners
        if self._eligible:
            previous = positions[-1] - _SPACE
            for index, position in enumerate(positions):
                arcs[owners[index]] += position - previous
                previous = position
        return {name: arc / _SPACE for name, arc in sorted(arcs.items())}

    # --- building ------------------------------------------------------------------------------

    def _require(self, name: str) -> Member:
        member = self._members.get(name)
        if member is None:
            known = ", ".join(sorted(self._members)[:10]) or "none"
            raise UnknownMember(f"no member {name!r} on the ring (members: {known})")
        return member

    def _why_empty(self) -> str:
        if not self._members:
            return "the ring has no members: no worker can take the key"
        return f"all {len(self._members)} members of the ring are draining: no worker can take it"

    def _install(self, members: dict[str, Member]) -> None:
        """Build every structure for ``members`` in locals, then assign them all at once."""
        points: dict[str, list[int]] = {}
        for name, member in members.items():
            wanted = points_for(member.weight, self.points_per_weight)
            cached = self._points.get(name, [])
            # A weight change keeps the prefix of the member's points: only the tail differs.
            if len(cached) >= wanted:
                points[name] = cached[:wanted]
            else:
                points[name] = cached + _point_range(name, len(cached), wanted)
        order = sorted(members)  # ties on a position go to the smaller name, in every process
        if len(order) > _MAX_MEMBERS:
            raise RingError(f"a ring holds at most {_MAX_MEMBERS} members, got {len(order)}")
        rank = {name: i for i, name in enumerate(order)}
        # Sorting plain ints is much faster than sorting (position, name) tuples.
        packed = sorted(
            (position << 16) | rank[name] for name in order for position in points[name]
        )
        positions = [p >> 16 for p in packed]
        names = [order[p & 0xFFFF] for p in packed]
        eligible = [n for n in order if not members[n].draining]
        owners = _effective_owners(names, {n for n in order if members[n].draining})
        if eligible:
            owners.append(owners[0])  # a key past the last point wraps to the first
            bits = self._bits_for(len(positions))
            table, spans = _bucket_index(positions, owners, bits)
        else:
            bits, table, spans = 0, [None], {}
        (
            self._members,
            self._points,
            self._positions,
            self._owners,
            self._eligible,
            self._shift,
            self._spans,
            self._table,
            self._fingerprint,
        ) = (
            dict(sorted(members.items())),
            points,
            positions,
            owners,
            tuple(eligible),
            64 - bits,
            spans,
            table,
            ring_fingerprint(members.values(), self.points_per_weight),
        )

    def _bits_for(self, point_count: int) -> int:
        if self._index_bits is not None:
            return self._index_bits
        needed = max(1, point_count).bit_length() + _BUCKETS_PER_POINT_LOG2
        return min(_MAX_INDEX_BITS, needed)


def _effective_owners(names: list[str], draining: set[str]) -> list[str]:
    """For each point, the first owner at or after it (cyclically) that is not draining."""
    if len(draining) == 0:
        return list(names)
    count = len(names)
    owners = list(names)
    following: str | None = None
    # Two passes backwards round the circle: the first finds the successor of the last points.
    for i in range(2 * count - 1, -1, -1):
        name = names[i % count]
        if name not in draining:
            following = name
        if i < count and following is not None:
            owners[i] = following
    return owners


def _bucket_index(
    positions: list[int], owners: list[str], bits: int
) -> tuple[list[str | None], dict[int, tuple[int, int]]]:
    """The lookup index over sorted ``positions`` (``owners`` has one extra, wrapping entry).

    ``table[b]`` is the owner of every key in bucket ``b`` when the bucket holds no point, else
    None; for those buckets ``spans[b]`` is the slice of ``positions`` inside it. Built point by
    point with list repetition, so the cost follows the number of points, not of buckets.
    """
    shift = 64 - bits
    table: list[str | None] = []
    spans: dict[int, tuple[int, int]] = {}
    count = len(positions)
    first = 0
    while first < count:
        bucket = positions[first] >> shift
        stop = first + 1
        while stop < count and positions[stop] >> shift == bucket:
            stop += 1
        table.extend([owners[first]] * (bucket - len(table)))  # empty buckets before this one
        table.append(None)
        spans[bucket] = (first, stop)
        first = stop
    table.extend([owners[count]] * ((1 << bits) - len(table)))  # past the last point: wrap
    return table, spans
