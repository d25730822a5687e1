"""The points of a ring, in buckets by the top bits of their positions (the lookup index).

A :class:`PointIndex` is immutable: an edit returns a new index that shares every bucket it did
not touch with the old one, so a ring change costs the buckets its points land in (a join or
leave at 4,096 points touches about 4,096 of the 131,072), not a copy of every point, and a
ring derived from another never changes it. Beside the buckets, an owner table answers most
lookups on a small ring without a bucket: its arcs are finer than the buckets while the points
are few, and as coarse as the buckets once they are many (:func:`fine_bits_for`). Design:
``docs/adr/0190-incremental-ring.md``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Protocol, Self, overload

SLOT_BITS = 16
"""Bits of a point's owner slot in its entry; a ring holds at most 2**16 members."""
SLOT_MASK = (1 << SLOT_BITS) - 1
HELD = SLOT_MASK
"""An owner-table arc that holds a point (or whose owner is slot 2**16 - 1): look in its bucket."""

FINE_BITS = 3
"""Owner-table arcs per bucket, as a power of two, while a ring's points are few."""
COARSE_ABOVE = 1 << 19
"""Above this many points (128 members of weight 1) the table's arcs are the buckets. Finer arcs
pay on every change: each touched bucket's arcs are worked out in Python (~2 us a bucket at 200
members, ~10 ms a join), and at 2**19 points only 61 % of arcs of 2**-20 are empty."""
FINE_AT_OR_BELOW = 1 << 17
"""A coarse table turns fine again at or below this many points (32 members of weight 1): far
enough below :data:`COARSE_ABOVE` that a rolling deploy near either never rebuilds the table on
each join and leave. Turning fine works out every bucket's arcs (~0.1 s at 2**17 points, once);
turning coarse is one pass over the buckets (~10 ms)."""
MAX_TABLE_BITS = 20
"""The owner table never has more than 2**20 arcs (2 MB)."""


class Bucket(Protocol):
    """One bucket: its points' entries in ring order, then its sentinel (see
    :class:`PointIndex`); an ``array('Q')`` or a list of ints."""

    def __len__(self) -> int: ...
    @overload
    def __getitem__(self, index: int, /) -> int: ...
    @overload
    def __getitem__(self, index: slice, /) -> Self: ...
    def __setitem__(self, index: int, value: int, /) -> None: ...
    def __iter__(self) -> Iterator[int]: ...
    def __delitem__(self, index: int, /) -> None: ...
    def append(self, value: int, /) -> None: ...
    def insert(self, index: int, value: int, /) -> None: ...
    def extend(self, values: Iterable[int], /) -> None: ...


Batch = tuple[int, Sequence[int]]
"""One member's points to add or drop: its slot and their positions."""


class PointIndex:
    """Every point of a ring, bucketed for lookup; editing returns a new index.

    Bucket ``b`` holds the points whose position has ``b`` in its top ``index_bits`` bits, each
    as the entry ``(position & low_mask) << SLOT_BITS | slot``, ascending, points at the same
    position in the order of their members' names. After them comes the bucket's sentinel,
    ``low_mask << SLOT_BITS | slot`` with the slot of the first point clockwise after the bucket.
    A key at ``position`` therefore belongs to the slot of the first entry in its bucket not
    below ``(position & low_mask) << SLOT_BITS``: a bisection, never a step past the bucket.
    Entries are 64-bit unsigned (``array('Q')``) when they fit (``index_bits >= 16``), else ints
    in a list.

    The owner table ``owners`` (``array('H')``) cuts the circle into ``2**fine`` arcs per
    bucket: arc ``position >> owner_shift`` holds the slot that owns every position in it when
    it holds no point, else :data:`HELD`. A lookup reads it first and bisects a bucket only on
    HELD: one read in 2 bytes an arc, where a bucket costs its list slot, its array and a
    bisection in it (at 20 members 92 % of keys land in an empty arc of 2**20).
    """

    __slots__ = (
        "_empties",
        "_make",
        "buckets",
        "count",
        "fine",
        "low_mask",
        "occupied",
        "owner_shift",
        "owners",
        "width",
    )

    def __init__(
        self,
        buckets: list[Bucket],
        occupied: bytearray,
        count: int,
        width: int,
        make: Callable[[Iterable[int]], Bucket],
        empties: dict[int, Bucket],
        owners: array[int],
        fine: int,
    ) -> None:
        """An index over ``buckets`` (``occupied[b]`` is 1 where bucket ``b`` holds a point)
        of ``count`` points, ``width`` low bits of position in each entry; ``empties`` holds
        one empty bucket per sentinel, shared by every empty bucket with that sentinel (and by
        the indexes derived from this one), so lookups there stay in the CPU's cache;
        ``owners`` is the owner table, ``2**fine`` arcs a bucket."""
        self.buckets = buckets
        self.occupied = occupied
        self.count = count
        self.width = width
        self.low_mask = (1 << width) - 1
        self._make = make
        self._empties = empties
        self.owners = owners
        self.fine = fine
        self.owner_shift = width - fine

    @classmethod
    def empty(cls, index_bits: int) -> PointIndex:
        """An index of ``2**index_bits`` buckets and no point (every sentinel names slot 0)."""
        width = 64 - index_bits
        make: Callable[[Iterable[int]], Bucket] = (
            partial(array, "Q") if width + SLOT_BITS <= 64 else list
        )
        sentinel = make((((1 << width) - 1) << SLOT_BITS,))
        size = 1 << index_bits
        fine = fine_bits_for(0, index_bits, None)
        owners = array("H", bytes(2 << (index_bits + fine)))
        empties = {sentinel[0]: sentinel}
        return cls([sentinel] * size, bytearray(size), 0, width, make, empties, owners, fine)

    def edited(
        self,
        dropped: Iterable[Batch],
        added: Iterable[Batch],
        names: list[str],
        fine: int | None = None,
    ) -> PointIndex:
        """A new index without the ``dropped`` points and with the ``added`` ones; ``names``
        maps each slot to its member's name, which orders points at the same position.
        ``fine`` sets the owner table's arcs per bucket (a power of two); None: by
        :func:`fine_bits_for` the new count of points."""
        drops, adds = self._grouped(dropped), self._grouped(added)
        nothing = self._make(())
        buckets, occupied = list(self.buckets), bytearray(self.occupied)
        count = self.count
        touched = array("L", sorted(drops.keys() | adds.keys()))
        # A big edit (a first build) stages its buckets in one flat array and cuts them out
        # once its groups are freed: built among the groups, they would hold the allocator's
        # memory in holes (RSS ~125 MB at 1,000 members instead of ~70).
        staged = self._make(()) if len(touched) > len(buckets) >> 2 else None
        ends = array("L")
        relink = array("L")  # buckets whose first point's slot changed: see _relink
        for b in touched:
            old, gone, new = buckets[b], drops.pop(b, nothing), adds.pop(b, nothing)
            bucket = _edited_bucket(old, gone, new, names, self._make)
            count += len(new) - len(gone)
            occupied[b] = len(bucket) > 1
            if bucket[0] != old[0]:  # its first point: the buckets before it follow that
                relink.append(b)
            if staged is None:
                buckets[b] = bucket
            else:
                staged.extend(bucket)
                ends.append(len(staged))
        if staged is not None:
            del drops, adds, nothing
            start = 0
            for b, end in zip(touched, ends, strict=True):
                buckets[b] = staged[start:end]
                start = end
        if fine is None:
            fine = fine_bits_for(count, 64 - self.width, self.fine)
        table = self._table_for(fine, buckets, touched if staged is None else None)
        for b in relink:
            _relink(buckets, occupied, b, self.low_mask << SLOT_BITS, self._empty, table)
        owners = table.whole(buckets, occupied) if table.owners is None else table.owners
        return PointIndex(
            buckets, occupied, count, self.width, self._make, self._empties, owners, fine
        )

    def _table_for(
        self, fine: int, buckets: list[Bucket], touched: Sequence[int] | None
    ) -> _OwnerTable:
        """The owner table of an edit that left ``buckets`` (before relinking): this one's,
        rewritten where the ``touched`` buckets are, or none yet (built whole after relinking)
        when its arcs change or the edit touched most buckets (``touched`` None)."""
        shift = SLOT_BITS + self.width - fine
        if touched is None or fine != self.fine:
            return _OwnerTable(None, fine, shift)
        table = _OwnerTable(self.owners[:], fine, shift)
        for b in touched:
            table.write(b, buckets[b])
        return table

    def clockwise(self, position: int) -> Iterator[int]:
        """The slots of every point once round the circle, from the first at or after
        ``position``."""
        buckets, width, remaining = self.buckets, self.width, self.count
        b = position >> width
        bucket = buckets[b]
        i = bisect_left(bucket, (position & self.low_mask) << SLOT_BITS, 0, len(bucket) - 1)
        while remaining:
            entries = bucket[i:-1][:remaining]
            for entry in entries:
                yield entry & SLOT_MASK
            remaining -= len(entries)
            b = self.occupied.find(1, b + 1)
            if b < 0:
                b = self.occupied.find(1)
            bucket, i = buckets[b], 0

    def ring_order(self) -> Iterator[tuple[int, int]]:
        """Every point as ``(position, slot)``, in ring order."""
        width = self.width
        for b in _positions_of(self.occupied):
            for entry in self.buckets[b][:-1]:
                yield b << width | entry >> SLOT_BITS, entry & SLOT_MASK

    def _empty(self, sentinel: int) -> Bucket:
        """The shared empty bucket with ``sentinel``."""
        empty = self._empties.get(sentinel)
        if empty is None:
            empty = self._empties[sentinel] = self._make((sentinel,))
        return empty

    def _grouped(self, batches: Iterable[Batch]) -> dict[int, Bucket]:
        """Each batch's points as entries, by bucket."""
        width, low, group = self.width, self.low_mask, self._make
        groups: dict[int, Bucket] = {}
        for slot, positions in batches:
            for position in positions:
                b = position >> width
                entries = groups.get(b)
                if entries is None:
                    entries = groups[b] = group(())
                entries.append((position & low) << SLOT_BITS | slot)
        return groups


def _edited_bucket(
    old: Bucket,
    gone: Bucket,
    new: Bucket,
    names: list[str],
    make: Callable[[Iterable[int]], Bucket],
) -> Bucket:
    """``old`` without the ``gone`` entries and with the ``new`` ones; its sentinel is kept
    (:func:`_relink` sets it when the next bucket's head changes)."""
    end = len(old) - 1
    if not gone and len(new) == 1:  # a join: one new point in most buckets it touches
        entry = new[0]
        i = bisect_left(old, entry, 0, end)
        at = entry >> SLOT_BITS
        # Unless a neighbour is at the same position (equal 64-bit hashes: in theory only).
        if (i == end or old[i] >> SLOT_BITS != at) and (i == 0 or old[i - 1] >> SLOT_BITS != at):
            bucket = old[:]
            bucket.insert(i, entry)
            return bucket
    elif not new and len(gone) == 1:  # a leave
        entry = gone[0]
        i = bisect_left(old, entry >> SLOT_BITS << SLOT_BITS, 0, end)
        while old[i] != entry:  # past points of other members at the same position
            i += 1
        bucket = old[:]
        del bucket[i]
        return bucket
    body = list(old[:end])
    for entry in gone:
        body.remove(entry)
    body += new
    body.sort()
    if len({entry >> SLOT_BITS for entry in body}) < len(body):  # points share a position
        body.sort(key=lambda e: (e >> SLOT_BITS, names[e & SLOT_MASK]))
    body.append(old[end])
    return make(body)


def _relink(
    buckets: list[Bucket],
    occupied: bytearray,
    b: int,
    blank: int,
    empty_bucket: Callable[[int], Bucket],
    table: _OwnerTable,
) -> None:
    """Bucket ``b``'s first point changed: point the sentinels of the buckets before it (the
    empty ones back to the last that holds a point, and that one) at the new first point
    clockwise from ``b``, and their arcs in ``table``. ``blank`` is a sentinel without its
    slot."""
    size = len(buckets)
    after = occupied.find(1, b)
    if after < 0:
        after = occupied.find(1, 0, b)
    sentinel = blank | (buckets[after][0] & SLOT_MASK if after >= 0 else 0)
    before = occupied.rfind(1, 0, b)
    if before < 0:
        before = occupied.rfind(1, b)
    end = b if occupied[b] else b + 1  # an emptied b is one of the empty buckets
    slot = sentinel & SLOT_MASK
    if before < 0:  # no point anywhere
        buckets[:] = [empty_bucket(sentinel)] * size
        table.fill(0, size, slot)
        return
    empty = empty_bucket(sentinel)
    # Most runs of empty buckets are empty: no list, so no work for the garbage collector,
    # which would walk the new list of buckets (131,072 entries) for each 700 lists made.
    if before < end - 1:
        buckets[before + 1 : end] = [empty] * (end - before - 1)
        table.fill(before + 1, end, slot)
    elif before >= end:
        buckets[before + 1 :] = [empty] * (size - before - 1)
        buckets[:end] = [empty] * end
        table.fill(before + 1, size, slot)
        table.fill(0, end, slot)
    last = buckets[before]
    if last[-1] != sentinel:
        last = last[:]
        last[-1] = sentinel
        buckets[before] = last
        table.write(before, last)


def fine_bits_for(count: int, index_bits: int, current: int | None) -> int:
    """The owner table's arcs per bucket (a power of two) for an index of ``count`` points and
    ``2**index_bits`` buckets whose table now has ``current`` (None: a new index).

    :data:`FINE_BITS` while the points are few, 0 (an arc per bucket) when they are many, and
    between :data:`FINE_AT_OR_BELOW` and :data:`COARSE_ABOVE` what it was."""
    finest = max(0, min(FINE_BITS, MAX_TABLE_BITS - index_bits))
    if count > COARSE_ABOVE:
        return 0
    if count <= FINE_AT_OR_BELOW or current is None:
        return finest
    return min(current, finest)


class _OwnerTable:
    """The owner table of an index being derived: its arcs rewritten bucket by bucket, or
    (``owners`` None) built whole once the buckets are done."""

    __slots__ = ("arcs", "fine", "owners", "shift")

    def __init__(self, owners: array[int] | None, fine: int, shift: int) -> None:
        """``shift`` takes an entry to its arc within its bucket."""
        self.owners, self.fine, self.arcs, self.shift = owners, fine, 1 << fine, shift

    def write(self, b: int, bucket: Bucket) -> None:
        """Rewrite the arcs of bucket ``b``, which now holds ``bucket``."""
        owners = self.owners
        if owners is None:
            return
        if self.fine:
            owners[b << self.fine : (b + 1) << self.fine] = self.arcs_of(bucket)
        else:
            owners[b] = HELD if len(bucket) > 1 else bucket[0] & SLOT_MASK

    def fill(self, start: int, stop: int, slot: int) -> None:
        """Buckets ``start`` up to ``stop`` hold no point and go to ``slot``."""
        if self.owners is not None and stop > start:
            arcs = (stop - start) << self.fine
            self.owners[start << self.fine : stop << self.fine] = array("H", (slot,)) * arcs

    def arcs_of(self, bucket: Bucket) -> array[int]:
        """The arcs of ``bucket``: HELD where a point is, else the slot of the first point
        after (in the bucket, or its sentinel's)."""
        shift, after = self.shift, self.arcs  # arcs from ``after`` on are written
        arcs = [HELD] * after
        owner = bucket[-1] & SLOT_MASK
        for i in range(len(bucket) - 2, -1, -1):
            entry = bucket[i]
            arc = entry >> shift
            if arc + 1 < after:
                arcs[arc + 1 : after] = [owner] * (after - arc - 1)
            after, owner = arc, entry & SLOT_MASK
        arcs[:after] = [owner] * after
        return array("H", arcs)

    def whole(self, buckets: list[Bucket], occupied: bytearray) -> array[int]:
        """The table of every bucket."""
        if not self.fine:
            return array(
                "H",
                [
                    HELD if held else bucket[0] & SLOT_MASK
                    for held, bucket in zip(occupied, buckets, strict=True)
                ],
            )
        owners, size, fine = array("H"), len(buckets), self.fine
        b = 0
        while b < size:
            held = occupied.find(1, b)
            if held < 0:
                held = size
            if held > b:  # a run of empty buckets: one sentinel
                owners.extend(array("H", (buckets[b][0] & SLOT_MASK,)) * ((held - b) << fine))
            if held < size:
                owners.extend(self.arcs_of(buckets[held]))
            b = held + 1
        return owners


def _positions_of(occupied: bytearray) -> Iterator[int]:
    """The indices of the set bytes of ``occupied``, ascending."""
    b = occupied.find(1)
    while b >= 0:
        yield b
        b = occupied.find(1, b + 1)
