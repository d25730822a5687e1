"""Properties of the ring (Hypothesis): order independence, minimal movement, drain, balance.

Each property compares the ring against the definition (the first eligible point clockwise),
computed here from the points alone, so a wrong index or a wrong walk fails them.
"""

from __future__ import annotations

import bisect

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kernel.errors import EmptyRing
from router.placement.ring import DEFAULT_POINTS_PER_WEIGHT, Member, MemberState, Ring, key_position

KEYS = [f"trajectory-{i}" for i in range(1_500)]

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.#", min_size=1, max_size=10)
weights = st.sampled_from([0.25, 0.5, 1, 1.5, 2, 3])
points_per_weight = st.integers(min_value=1, max_value=48)
index_bits = st.none() | st.integers(min_value=0, max_value=12)
positions = st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=50)


@st.composite
def fleets(draw: st.DrawFn, min_size: int = 1, max_size: int = 6) -> list[Member]:
    """Distinct members with weights; some drain, but never all of them."""
    chosen = draw(st.lists(names, min_size=min_size, max_size=max_size, unique=True))
    members = []
    for i, name in enumerate(chosen):
        state = MemberState.DRAINING if i > 0 and draw(st.booleans()) else MemberState.ACTIVE
        members.append(Member(name, draw(weights), state))
    return draw(st.permutations(members))


def all_points(ring: Ring) -> list[tuple[int, str]]:
    return sorted((p, m.name) for m in ring.members for p in ring.points_of(m.name))


def owner_by_definition(points: list[tuple[int, str]], skip: set[str], position: int) -> str:
    """The first point at or after ``position`` (wrapping) whose member is not skipped."""
    start = bisect.bisect_left(points, (position, ""))
    for step in range(len(points)):
        _, name = points[(start + step) % len(points)]
        if name not in skip:
            return name
    raise AssertionError("no eligible member")


def probe_positions(ring: Ring, extra: list[int]) -> list[int]:
    """Positions where a lookup can go wrong: on, just before and just after each point."""
    probes = {0, 2**64 - 1, *extra}
    for position, _ in all_points(ring):
        probes |= {position, max(position - 1, 0), min(position + 1, 2**64 - 1)}
    return sorted(probes)


def draining(ring: Ring) -> set[str]:
    return {m.name for m in ring.members if m.draining}


@settings(max_examples=60, deadline=None)
@given(fleets(), points_per_weight, index_bits, positions)
def test_lookup_is_the_first_eligible_point_clockwise(
    members: list[Member], per_weight: int, bits: int | None, extra: list[int]
) -> None:
    ring = Ring(members, points_per_weight=per_weight, index_bits=bits)
    points, skip = all_points(ring), draining(ring)
    for position in probe_positions(ring, extra):
        assert ring.lookup_position(position) == owner_by_definition(points, skip, position)


@settings(max_examples=60, deadline=None)
@given(fleets(), points_per_weight, st.data())
def test_a_lookup_excluding_members_is_the_first_point_of_another_eligible_member(
    members: list[Member], per_weight: int, data: st.DataObject
) -> None:
    """The walk a turn handed back takes: skip the draining members and the excluded ones."""
    ring = Ring(members, points_per_weight=per_weight)
    exclude = frozenset(data.draw(st.sets(st.sampled_from([m.name for m in members]))))
    points, skip = all_points(ring), draining(ring) | exclude
    for key in KEYS[:200]:
        if {m.name for m in members} <= skip:
            with pytest.raises(EmptyRing):
                ring.lookup_excluding(key, exclude)
            continue
        expected = owner_by_definition(points, skip, key_position(key))
        assert ring.lookup_excluding(key, exclude) == expected


@settings(max_examples=40, deadline=None)
@given(fleets(), points_per_weight, st.data())
def test_the_ring_is_the_same_whatever_the_insertion_order(
    members: list[Member], per_weight: int, data: st.DataObject
) -> None:
    built = Ring(members, points_per_weight=per_weight)
    # Grow a second ring member by member in another order, draining as we go.
    grown = Ring(points_per_weight=per_weight, index_bits=data.draw(index_bits))
    for member in data.draw(st.permutations(members)):
        grown.add(member.name, member.weight)
        if member.draining:
            grown.drain(member.name)
    assert grown.fingerprint == built.fingerprint
    assert all_points(grown) == all_points(built)
    assert grown.shares() == built.shares()
    assert [grown.lookup(k) for k in KEYS] == [built.lookup(k) for k in KEYS]


@settings(max_examples=40, deadline=None)
@given(fleets(), points_per_weight, names, weights)
def test_adding_a_member_moves_keys_only_onto_it(
    members: list[Member], per_weight: int, newcomer: str, weight: float
) -> None:
    assume(newcomer not in {m.name for m in members})
    ring = Ring(members, points_per_weight=per_weight)
    before = {k: ring.lookup(k) for k in KEYS}
    ring.add(newcomer, weight)
    points, skip = all_points(ring), draining(ring)
    for key in KEYS:
        after = ring.lookup(key)
        assert after in (before[key], newcomer)
        # ...and it moves exactly when the newcomer now owns its position.
        expected = owner_by_definition(points, skip, key_position(key))
        assert after == expected


@settings(max_examples=40, deadline=None)
@given(fleets(min_size=2), points_per_weight, st.data())
def test_removing_a_member_moves_only_its_keys_each_to_its_clockwise_successor(
    members: list[Member], per_weight: int, data: st.DataObject
) -> None:
    ring = Ring(members, points_per_weight=per_weight)
    active = [m.name for m in ring.members if not m.draining]
    leaving = data.draw(st.sampled_from([m.name for m in ring.members]))
    if active == [leaving]:
        return  # removing the only active member leaves nothing to move keys to
    old_points, skip = all_points(ring), draining(ring)
    before = {k: ring.lookup(k) for k in KEYS}
    ring.remove(leaving)
    for key in KEYS:
        after = ring.lookup(key)
        if before[key] != leaving:
            assert after == before[key]
        else:
            position = key_position(key)
            assert after == owner_by_definition(old_points, skip | {leaving}, position)


@settings(max_examples=40, deadline=None)
@given(fleets(min_size=2), points_per_weight, st.data())
def test_a_weight_change_moves_only_keys_to_or_from_that_member(
    members: list[Member], per_weight: int, data: st.DataObject
) -> None:
    ring = Ring(members, points_per_weight=per_weight)
    changed = data.draw(st.sampled_from([m.name for m in ring.members if not m.draining]))
    old_weight = ring.member(changed).weight
    new_weight = data.draw(weights.filter(lambda w: w != old_weight))
    old_points = all_points(ring)
    before = {k: ring.lookup(k) for k in KEYS}
    ring.set_weight(changed, new_weight)
    new_points = all_points(ring)
    if new_weight > old_weight:
        # Points are only added, all of them the changed member's.
        assert set(old_points) <= set(new_points)
        assert {n for _, n in set(new_points) - set(old_points)} <= {changed}
        for key in KEYS:
            assert ring.lookup(key) in (before[key], changed)
    else:
        assert set(new_points) <= set(old_points)
        assert {n for _, n in set(old_points) - set(new_points)} <= {changed}
        for key in KEYS:
            after = ring.lookup(key)
            if after != before[key]:
                assert before[key] == changed
                # ...to the owner of the next point that survived.
                skip = draining(ring)
                assert after == owner_by_definition(new_points, skip, key_position(key))


@settings(max_examples=40, deadline=None)
@given(fleets(min_size=2), points_per_weight, st.data())
def test_a_draining_member_receives_no_new_keys_and_places_as_if_removed(
    members: list[Member], per_weight: int, data: st.DataObject
) -> None:
    ring = Ring(members, points_per_weight=per_weight)
    active = [m.name for m in ring.members if not m.draining]
    if len(active) < 2:
        return
    drained = data.draw(st.sampled_from(active))
    before = {k: ring.lookup(k) for k in KEYS}
    ring.drain(drained)
    removed = Ring((m for m in ring.members if m.name != drained), points_per_weight=per_weight)
    for key in KEYS:
        after = ring.lookup(key)
        assert after != drained
        assert after == removed.lookup(key)
        if before[key] != drained:
            assert after == before[key]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(
        st.tuples(names, st.integers(min_value=1, max_value=3)),
        min_size=2,
        max_size=6,
        unique_by=lambda t: t[0],
    )
)
def test_each_share_is_within_ten_percent_of_its_weight_share_at_default_points(
    chosen: list[tuple[str, int]],
) -> None:
    ring = Ring(Member(name, weight) for name, weight in chosen)
    assert ring.points_per_weight == DEFAULT_POINTS_PER_WEIGHT
    total = sum(weight for _, weight in chosen)
    shares = ring.shares()
    for name, weight in chosen:
        expected = weight / total
        assert abs(shares[name] - expected) <= 0.10 * expected, (name, shares[name], expected)


@settings(max_examples=60, deadline=None)
@given(fleets(min_size=0), fleets(), points_per_weight, index_bits, st.data())
def test_a_ring_evolved_by_its_difference_is_the_ring_built_from_scratch(
    before: list[Member],
    after: list[Member],
    per_weight: int,
    bits: int | None,
    data: st.DataObject,
) -> None:
    """The incremental path (points dropped and merged, the index shifted) places every key
    where a fresh build does, and leaves the ring it started from as it was."""
    # Some members stay (perhaps with another weight or state), some leave, some arrive.
    kept = (
        data.draw(st.lists(st.sampled_from(before), unique_by=lambda m: m.name)) if before else []
    )
    arriving = [m for m in after if m.name not in {k.name for k in kept}]
    target = [
        Member(m.name, data.draw(weights), data.draw(st.sampled_from(list(MemberState))))
        for m in kept
    ] + arriving
    assume(any(not m.draining for m in target))
    old = Ring(before, points_per_weight=per_weight, index_bits=bits)
    old_placement = {p: _owner_or_none(old, p) for p in probe_positions(old, [])}
    evolved = old.evolved(target)
    fresh = Ring(target, points_per_weight=per_weight, index_bits=bits)
    assert evolved.fingerprint == fresh.fingerprint
    assert evolved.point_count == fresh.point_count
    for position in probe_positions(fresh, probe_positions(old, [])):
        assert evolved.lookup_position(position) == fresh.lookup_position(position)
    assert {p: _owner_or_none(old, p) for p in old_placement} == old_placement


def _owner_or_none(ring: Ring, position: int) -> str | None:
    try:
        return ring.lookup_position(position)
    except EmptyRing:
        return None


@settings(max_examples=30, deadline=None)
@given(
    points_per_weight, index_bits, st.lists(st.tuples(st.booleans(), names, weights), max_size=12)
)
def test_a_ring_evolved_through_joins_and_leaves_is_the_ring_built_from_scratch(
    per_weight: int, bits: int | None, steps: list[tuple[bool, str, float]]
) -> None:
    """Each version shares the buckets it did not touch with the one before: a long lineage
    places every key where a fresh build of its last membership does, and never changes an
    earlier version."""
    lineage = [Ring(points_per_weight=per_weight, index_bits=bits)]
    for joining, name, weight in steps:
        members = {m.name: m for m in lineage[-1].members}
        if joining:
            members[name] = Member(name, weight)
        elif members:
            members.pop(sorted(members)[len(name) % len(members)])
        lineage.append(lineage[-1].evolved(members.values()))
    for version in lineage:
        fresh = Ring(version.members, points_per_weight=per_weight, index_bits=bits)
        assert version.point_count == fresh.point_count
        assert version.shares() == fresh.shares()
        for position in probe_positions(fresh, []):
            assert _owner_or_none(version, position) == _owner_or_none(fresh, position)
