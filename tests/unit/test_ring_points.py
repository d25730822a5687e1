"""The ring's point index: its owner table against the points it was derived from.

A lookup reads the owner table first and bisects a bucket only where the table says a point is
in the arc, so a wrong arc places keys on the wrong member. These tests derive the table from
the points alone and compare, through edits that keep, refine and coarsen its arcs.
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.placement import points as points_module
from router.placement.points import (
    COARSE_ABOVE,
    FINE_AT_OR_BELOW,
    FINE_BITS,
    HELD,
    PointIndex,
    fine_bits_for,
)
from router.placement.ring import Member, Ring, key_position

NAMES = [f"m{i}" for i in range(6)]


def table_by_definition(index: PointIndex) -> list[int]:
    """Each arc: HELD if a point is in it, else the slot of the first point clockwise after."""
    order = list(index.ring_order())
    arc_bits = 64 - index.owner_shift
    arcs = 1 << arc_bits
    if not order:
        return [0] * arcs
    positions = [position for position, _ in order]
    held = {position >> index.owner_shift for position in positions}
    table = []
    for arc in range(arcs):
        if arc in held:
            table.append(HELD)
        else:
            start = arc << index.owner_shift
            table.append(order[bisect.bisect_left(positions, start) % len(order)][1])
    return table


# Positions clustered in a few regions so arcs hold several points, are emptied and refilled.
positions = st.builds(
    lambda region, offset: (region << 58) | offset,
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=0, max_value=(1 << 58) - 1),
)
edits = st.lists(
    st.tuples(
        st.sampled_from(range(len(NAMES))),
        st.lists(positions, min_size=1, max_size=12, unique=True),
        st.sampled_from([None, 0, 1, 2, 3]),
    ),
    max_size=10,
)


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=7), edits, st.data())
def test_the_owner_table_is_derived_from_the_points_through_any_edits(
    index_bits: int, steps: list[tuple[int, list[int], int | None]], data: st.DataObject
) -> None:
    """Members join, leave or change their points; the table's arcs change between edits
    (fine None: by the policy). Every version's table matches its points, and an edit never
    changes the table of the version it started from."""
    versions = [PointIndex.empty(index_bits)]
    held: dict[int, list[int]] = {}  # slot -> its positions in the latest version
    for slot, new_positions, fine in steps:
        index = versions[-1]
        dropped = [(slot, held[slot])] if slot in held and data.draw(st.booleans()) else []
        if dropped:
            del held[slot]
            added = []
        else:
            added = [(slot, [p for p in new_positions if p not in held.get(slot, [])])]
            held.setdefault(slot, []).extend(added[0][1])
        edited = index.edited(dropped, added, NAMES, fine)
        if fine is not None:
            assert edited.fine == fine
        versions.append(edited)
    snapshots = [v.owners.tolist() for v in versions]
    for version, snapshot in zip(versions, snapshots, strict=True):
        assert snapshot == table_by_definition(version)


def test_the_table_is_fine_while_points_are_few_and_coarse_when_many() -> None:
    assert fine_bits_for(0, 17, None) == FINE_BITS
    assert fine_bits_for(COARSE_ABOVE, 17, FINE_BITS) == FINE_BITS
    assert fine_bits_for(COARSE_ABOVE + 1, 17, FINE_BITS) == 0
    # Between the thresholds a table keeps its arcs, so a rolling deploy does not flip them.
    assert fine_bits_for(FINE_AT_OR_BELOW + 1, 17, 0) == 0
    assert fine_bits_for(FINE_AT_OR_BELOW + 1, 17, FINE_BITS) == FINE_BITS
    assert fine_bits_for(FINE_AT_OR_BELOW, 17, 0) == FINE_BITS
    # A new index between them starts fine; the table never exceeds 2**20 arcs.
    assert fine_bits_for(FINE_AT_OR_BELOW + 1, 17, None) == FINE_BITS
    assert fine_bits_for(0, 18, None) == 2
    assert fine_bits_for(0, 24, None) == 0


def test_default_ring_tables_follow_the_fleet_size() -> None:
    small = Ring(Member(f"worker-{i:02d}") for i in range(20))
    assert small._points.fine == FINE_BITS
    assert len(small._points.owners) == 1 << (17 + FINE_BITS)


def reference(ring: Ring, position: int) -> str:
    pts = sorted((p, m.name) for m in ring.members for p in ring.points_of(m.name))
    skip = {m.name for m in ring.members if m.draining}
    start = bisect.bisect_left(pts, (position, ""))
    for step in range(len(pts)):
        _, name = pts[(start + step) % len(pts)]
        if name not in skip:
            return name
    raise AssertionError("no eligible member")


@pytest.mark.parametrize("index_bits", [4, 10])
def test_a_ring_places_by_definition_as_its_table_coarsens_and_refines(
    index_bits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thresholds lowered to a few points: a lineage grows past the coarse one and shrinks
    below the fine one; at each step both lookups agree with the definition, draining
    included, and the ring each step started from still places as it did."""
    monkeypatch.setattr(points_module, "COARSE_ABOVE", 40)
    monkeypatch.setattr(points_module, "FINE_AT_OR_BELOW", 16)
    keys = [f"trajectory-{i}" for i in range(300)]
    ring = Ring(points_per_weight=8, index_bits=index_bits)
    seen = []
    sizes = [1, 2, 3, 4, 5, 6, 7, 6, 5, 4, 3, 2, 1]
    for size in sizes:
        members = [Member(f"w{i}") for i in range(size)]
        if size > 2:
            members[1] = Member("w1", 1.0, state=members[1].state.DRAINING)
        ring = ring.evolved(members)
        seen.append((ring, ring._points.fine, [ring.lookup(k) for k in keys]))
        probes = {0, 2**64 - 1}
        for member in ring.members:
            for p in ring.points_of(member.name):
                probes |= {p, max(p - 1, 0), min(p + 1, 2**64 - 1)}
        for position in sorted(probes):
            assert ring.lookup_position(position) == reference(ring, position)
        for key, owner in zip(keys, seen[-1][2], strict=True):
            assert owner == reference(ring, key_position(key))
    fines = [fine for _, fine, _ in seen]
    assert 0 in fines and fines[0] == fines[-1] != 0  # it coarsened and refined again
    for version, _, placed in seen:
        assert [version.lookup(k) for k in keys] == placed


def test_the_index_shape_reports_buckets_and_arcs() -> None:
    small = Ring((Member(f"worker-{i}") for i in range(3)), points_per_weight=8, index_bits=10)
    assert small.index_shape == (1 << 10, 1 << (10 + FINE_BITS))
