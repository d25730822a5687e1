"""The consistent-hash ring: placement, stability across processes, drain, remove, bad input."""

from __future__ import annotations

import bisect
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel.errors import (
    DuplicateMember,
    EmptyRing,
    InvalidInput,
    InvalidMemberName,
    InvalidWeight,
    RingError,
    UnknownMember,
)
from router.placement.ring import (
    DEFAULT_POINTS_PER_WEIGHT,
    Member,
    MemberState,
    Ring,
    key_position,
    point_positions,
    points_for,
    ring_fingerprint,
)

REPO = Path(__file__).resolve().parents[2]
KEYS = [f"trajectory-{i}" for i in range(5_000)]
SMALL = 32  # points per weight where a test does not depend on the default


def fleet(count: int = 5, points: int = SMALL, **kwargs: int) -> Ring:
    return Ring((Member(f"worker-{i}") for i in range(count)), points_per_weight=points, **kwargs)


def snapshot(ring: Ring) -> tuple[str, tuple[Member, ...], int]:
    """What "the ring is unchanged" compares."""
    return ring.fingerprint, ring.members, ring.point_count


def reference_owner(ring: Ring, position: int, skip: frozenset[str] = frozenset()) -> str:
    """Owner by definition: first point at or after ``position`` clockwise, skipping members."""
    points = sorted((p, m.name) for m in ring.members for p in ring.points_of(m.name))
    skip = skip | {m.name for m in ring.members if m.draining}
    start = bisect.bisect_left(points, (position, ""))
    for step in range(len(points)):
        _, name = points[(start + step) % len(points)]
        if name not in skip:
            return name
    raise AssertionError("no eligible member")


# --- stability: the hash and the layout are the same everywhere --------------------------------


def test_key_position_is_xxh64_of_utf8_with_seed_zero() -> None:
    # 0xEF46DB3751D8E999 is the published xxh64 digest of the empty input with seed 0.
    assert key_position("") == 0xEF46DB3751D8E999
    assert key_position("é") == key_position("\u00e9")


def test_known_placements_do_not_change_between_releases() -> None:
    # Pinned once: a change here silently moves every session of every deployed fleet.
    ring = Ring(Member(f"worker-{i:02d}", 1 + i % 3) for i in range(12))
    assert ring.fingerprint == "bc93bfb4ac4e78f7"
    assert key_position("s-42") == 10450486552052150217
    assert [ring.lookup(k) for k in ("trajectory-0", "trajectory-1", "s-42", "")] == [
        "worker-01",
        "worker-10",
        "worker-07",
        "worker-08",
    ]


_PLACEMENTS_SCRIPT = """
import json
from router.placement.ring import Member, Ring
ring = Ring(Member(f"worker-{i:02d}", 1 + i % 3) for i in range(12))
ring.drain("worker-05")
keys = [f"trajectory-{i}" for i in range(10_000)]
print(json.dumps({
    "salted_hash": hash("s-42"),
    "fingerprint": ring.fingerprint,
    "placements": [ring.lookup(k) for k in keys],
}))
"""


def _placements_in_subprocess(hash_seed: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", _PLACEMENTS_SCRIPT],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_two_processes_with_different_hash_seeds_place_10000_keys_identically() -> None:
    first = _placements_in_subprocess("1")
    second = _placements_in_subprocess("2")
    # The processes really do salt str hashes differently, so agreement is not an accident.
    assert first["salted_hash"] != second["salted_hash"]
    assert first["fingerprint"] == second["fingerprint"]
    placements = first["placements"]
    assert isinstance(placements, list) and len(placements) == 10_000
    assert placements == second["placements"]
    assert "worker-05" not in placements  # the drain holds in both
    here = Ring(Member(f"worker-{i:02d}", 1 + i % 3) for i in range(12))
    here.drain("worker-05")
    assert placements == [here.lookup(f"trajectory-{i}") for i in range(10_000)]


# --- lookup matches the definition, whatever the index size ------------------------------------


@pytest.mark.parametrize("index_bits", [0, 1, 4, 8, 12, None])
def test_lookup_matches_the_definition_at_every_edge(index_bits: int | None) -> None:
    ring = fleet(4, points=8, index_bits=index_bits)
    ring.drain("worker-2")
    edges = {0, 2**64 - 1, 2**63, 2**63 - 1}
    for member in ring.members:
        for p in ring.points_of(member.name):
            edges |= {p, max(p - 1, 0), min(p + 1, 2**64 - 1)}
    for position in sorted(edges):
        assert ring.lookup_position(position) == reference_owner(ring, position), position


def test_lookup_position_refuses_positions_off_the_circle() -> None:
    ring = fleet(2)
    with pytest.raises(ValueError, match="outside"):
        ring.lookup_position(2**64)
    with pytest.raises(ValueError, match="outside"):
        ring.lookup_position(-1)


def test_points_follow_weight_and_name() -> None:
    ring = Ring([Member("a", 1), Member("b", 2.5)], points_per_weight=10)
    assert ring.points_of("a") == point_positions("a", 10)
    assert len(ring.points_of("b")) == 25 == points_for(2.5, 10)
    assert ring.point_count == 35
    assert points_for(0.0001, 10) == 1  # a tiny weight still owns one point


def test_shares_cover_the_circle_and_follow_weight() -> None:
    ring = Ring([Member("a", 1), Member("b", 3)])
    shares = ring.shares()
    assert math.isclose(sum(shares.values()), 1.0)
    assert shares["b"] / shares["a"] == pytest.approx(3.0, rel=0.1)


def test_default_points_are_the_documented_ones() -> None:
    ring = Ring([Member("a")])
    assert ring.points_per_weight == DEFAULT_POINTS_PER_WEIGHT
    assert ring.point_count == DEFAULT_POINTS_PER_WEIGHT


# --- drain, then remove ----------------------------------------------------------------------


def test_a_draining_member_gets_no_new_keys_and_others_keep_theirs() -> None:
    ring = fleet(5)
    before = {k: ring.lookup(k) for k in KEYS}
    assert "worker-3" in before.values()
    ring.drain("worker-3")
    after = {k: ring.lookup(k) for k in KEYS}
    assert "worker-3" not in after.values()
    assert all(after[k] == before[k] for k in KEYS if before[k] != "worker-3")
    assert ring.member("worker-3").state is MemberState.DRAINING
    assert ring.shares()["worker-3"] == 0.0
    assert ring.points_of("worker-3")  # the points stay


def test_removing_a_drained_member_moves_no_key() -> None:
    ring = fleet(5)
    ring.drain("worker-1")
    drained = [ring.lookup(k) for k in KEYS]
    ring.remove("worker-1")
    assert [ring.lookup(k) for k in KEYS] == drained
    assert "worker-1" not in ring


def test_draining_twice_changes_nothing() -> None:
    ring = fleet(3)
    ring.drain("worker-0")
    before = snapshot(ring)
    ring.drain("worker-0")
    assert snapshot(ring) == before


def test_remove_moves_only_the_removed_members_keys() -> None:
    ring = fleet(5)
    before = {k: ring.lookup(k) for k in KEYS}
    ring.remove("worker-4")
    moved = [k for k in KEYS if ring.lookup(k) != before[k]]
    assert moved and all(before[k] == "worker-4" for k in moved)
    assert {k for k in KEYS if before[k] == "worker-4"} == set(moved)


# --- bad input: a clear error, the ring unchanged ------------------------------------------------


def test_lookup_on_an_empty_ring_names_the_problem() -> None:
    with pytest.raises(EmptyRing, match="no members"):
        Ring().lookup("trajectory-1")


def test_lookup_when_every_member_drains_names_the_problem() -> None:
    ring = fleet(2)
    ring.drain("worker-0")
    ring.drain("worker-1")
    with pytest.raises(EmptyRing, match="all 2 members of the ring are draining"):
        ring.lookup("trajectory-1")
    with pytest.raises(EmptyRing):
        ring.lookup_position(0)
    assert set(ring.shares().values()) == {0.0}


def test_duplicate_member_is_refused_and_the_ring_is_unchanged() -> None:
    ring = fleet(3)
    before = snapshot(ring)
    with pytest.raises(DuplicateMember, match="'worker-1'"):
        ring.add("worker-1", 2)
    assert snapshot(ring) == before
    with pytest.raises(DuplicateMember, match="'a' appears twice"):
        Ring([Member("a"), Member("b"), Member("a", 2)])


@pytest.mark.parametrize("weight", [0, -1, -0.5, float("nan"), float("inf"), True, "2", None])
def test_a_weight_that_is_not_positive_is_refused(weight: object) -> None:
    ring = fleet(3)
    before = snapshot(ring)
    with pytest.raises(InvalidWeight, match="'worker-9'"):
        ring.add("worker-9", weight)  # type: ignore[arg-type]
    with pytest.raises(InvalidWeight, match="'worker-0'"):
        ring.set_weight("worker-0", weight)  # type: ignore[arg-type]
    with pytest.raises(InvalidWeight):
        Ring([Member("a", weight)])  # type: ignore[arg-type]
    assert snapshot(ring) == before


@pytest.mark.parametrize("operation", ["drain", "remove", "set_weight", "member", "points_of"])
def test_an_unknown_member_is_named_and_the_ring_is_unchanged(operation: str) -> None:
    ring = fleet(2)
    before = snapshot(ring)
    args: tuple[object, ...] = ("ghost", 2) if operation == "set_weight" else ("ghost",)
    with pytest.raises(UnknownMember, match=r"'ghost'.*worker-0, worker-1"):
        getattr(ring, operation)(*args)
    assert snapshot(ring) == before


@pytest.mark.parametrize("name", ["", " ", "a b", "tab\there", "x" * 201, "new\nline", 7])
def test_a_bad_member_name_is_refused(name: object) -> None:
    ring = fleet(2)
    before = snapshot(ring)
    with pytest.raises(InvalidMemberName):
        ring.add(name)  # type: ignore[arg-type]
    assert snapshot(ring) == before


def test_ring_errors_are_bad_input_in_the_one_tree() -> None:
    for error in (EmptyRing, DuplicateMember, UnknownMember, InvalidWeight, InvalidMemberName):
        assert issubclass(error, RingError)
        assert issubclass(error, InvalidInput)


def test_bad_construction_parameters_are_refused() -> None:
    with pytest.raises(RingError, match="points_per_weight"):
        Ring(points_per_weight=0)
    with pytest.raises(RingError, match="index_bits"):
        Ring(index_bits=25)


# --- fingerprint -------------------------------------------------------------------------------


def test_fingerprint_is_content_not_history() -> None:
    built = Ring([Member("b", 2), Member("a")], points_per_weight=SMALL)
    grown = Ring(points_per_weight=SMALL)
    grown.add("a")
    grown.add("c")
    grown.add("b", 5)
    grown.remove("c")
    grown.set_weight("b", 2)
    assert grown.fingerprint == built.fingerprint
    assert built.fingerprint == ring_fingerprint(built.members, SMALL)


def test_fingerprint_changes_with_weight_state_and_layout() -> None:
    ring = Ring([Member("a"), Member("b")], points_per_weight=SMALL)
    seen = {ring.fingerprint}
    ring.set_weight("a", 2)
    seen.add(ring.fingerprint)
    ring.drain("b")
    seen.add(ring.fingerprint)
    seen.add(Ring(ring.members, points_per_weight=SMALL + 1).fingerprint)
    assert len(seen) == 4
