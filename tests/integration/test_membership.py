"""Ring membership against the running Redis: heartbeats, lapse, drain acknowledgement, CLI.

Time is an injected clock that the tests move by hand; nothing sleeps.
"""

from __future__ import annotations

import json
import os

import pytest
import redis
from typer.testing import CliRunner

from kernel.errors import (
    InvalidMemberName,
    InvalidWeight,
    RingError,
    StoreError,
    UnknownMember,
)
from ops.cli.ring import ring_app
from router.placement.membership import Membership, Progress, ReplicaRing
from router.placement.ring import Member, MemberState, Ring
from tests.support import ManualClock

pytestmark = pytest.mark.redis

POINTS = 64  # small rings: these tests are about membership, not balance
TIMEOUT = 5.0
KEYS = [f"trajectory-{i}" for i in range(2_000)]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000.0)


@pytest.fixture
def membership(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Membership:
    return Membership(
        redis_client,
        key_prefix,
        heartbeat_timeout_s=TIMEOUT,
        clock=clock,
        points_per_weight=POINTS,
    )


def raw_state(client: redis.Redis, membership: Membership) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = client.hgetall(membership.members_key)
    return state


def test_registered_members_form_the_ring_with_their_weights(membership: Membership) -> None:
    membership.register("w1")
    membership.register("w2", 2)
    ring = membership.build_ring()
    assert ring.members == (Member("w1", 1.0), Member("w2", 2.0))
    assert ring.point_count == 3 * POINTS
    assert [r.name for r in membership.records()] == ["w1", "w2"]
    assert all(r.live and not r.draining for r in membership.records())


def test_every_key_begins_with_the_prefix(
    membership: Membership, redis_client: redis.Redis, key_prefix: str
) -> None:
    membership.register("w1")
    ReplicaRing(membership, "router-a").refresh()
    keys = {k.decode() for k in redis_client.scan_iter(match=f"*{key_prefix}*")}
    assert keys == {membership.members_key, membership.replicas_key}
    assert all(k.startswith(key_prefix + ":") for k in keys)


def test_a_lapsed_heartbeat_leaves_the_ring_and_a_fresh_one_brings_it_back(
    membership: Membership, clock: ManualClock
) -> None:
    membership.register("w1")
    membership.register("w2")
    clock.advance(4.0)
    membership.heartbeat("w1")
    clock.advance(1.5)  # w2's heartbeat is now 5.5 s old, w1's 1.5 s
    assert {m.name for m in membership.live_members()} == {"w1"}
    assert [(r.name, r.live) for r in membership.records()] == [("w1", True), ("w2", False)]
    assert "w2" not in membership.build_ring()
    membership.heartbeat("w2")
    assert {m.name for m in membership.live_members()} == {"w1", "w2"}


def test_heartbeat_exactly_at_the_timeout_is_still_live(
    membership: Membership, clock: ManualClock
) -> None:
    membership.register("w1")
    clock.advance(TIMEOUT)
    assert [m.name for m in membership.live_members()] == ["w1"]
    clock.advance(0.001)
    assert membership.live_members() == ()


def test_drain_is_a_flag_beside_the_weight_and_survives_reregistration(
    membership: Membership,
) -> None:
    membership.register("w1")
    membership.register("w2")
    membership.drain("w2")
    membership.register("w2", 3)  # a drained worker restarting must stay drained
    ring = membership.build_ring()
    assert ring.member("w2") == Member("w2", 3.0, MemberState.DRAINING)
    assert {ring.lookup(k) for k in KEYS} == {"w1"}


def test_remove_deletes_the_whole_entry(membership: Membership, redis_client: redis.Redis) -> None:
    membership.register("w1")
    membership.register("w2")
    membership.drain("w2")
    membership.remove("w2")
    assert set(raw_state(redis_client, membership)) == {b"w:w1", b"hb:w1", b"p:w1"}
    membership.register("w2")  # a new worker of the same name starts active
    assert not membership.build_ring().member("w2").draining


@pytest.mark.parametrize("operation", ["heartbeat", "drain", "remove", "drain_status"])
def test_an_unknown_member_is_named_and_nothing_is_written(
    membership: Membership, redis_client: redis.Redis, operation: str
) -> None:
    membership.register("w1")
    before = raw_state(redis_client, membership)
    with pytest.raises(UnknownMember, match=r"'ghost'.*members: w1"):
        getattr(membership, operation)("ghost")
    assert raw_state(redis_client, membership) == before


def test_unknown_after_remove_cannot_be_revived_by_a_late_heartbeat(
    membership: Membership, redis_client: redis.Redis
) -> None:
    membership.register("w1")
    membership.remove("w1")
    with pytest.raises(UnknownMember):
        membership.heartbeat("w1")
    with pytest.raises(UnknownMember):
        membership.drain("w1")
    assert raw_state(redis_client, membership) == {}


@pytest.mark.parametrize(
    ("name", "weight", "error"),
    [
        ("w 1", 1, InvalidMemberName),
        ("", 1, InvalidMemberName),
        ("w1", 0, InvalidWeight),
        ("w1", -2, InvalidWeight),
        ("w1", float("nan"), InvalidWeight),
    ],
)
def test_bad_registration_is_refused_and_nothing_is_written(
    membership: Membership,
    redis_client: redis.Redis,
    name: str,
    weight: float,
    error: type[RingError],
) -> None:
    with pytest.raises(error):
        membership.register(name, weight)
    assert raw_state(redis_client, membership) == {}


def test_every_replica_builds_the_identical_ring(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    writer = Membership(redis_client, key_prefix, clock=clock, points_per_weight=POINTS)
    for i in range(6):
        writer.register(f"worker-{i}", 1 + i % 3)
    writer.drain("worker-4")
    # Two replicas, each with its own client and its own Membership, as on two machines.
    replicas = []
    for replica_id in ("router-a", "router-b"):
        client = redis.Redis(connection_pool=redis_client.connection_pool)
        view = Membership(client, key_prefix, clock=clock, points_per_weight=POINTS)
        replicas.append(ReplicaRing(view, replica_id))
    rings = [replica.refresh() for replica in replicas]
    assert rings[0].fingerprint == rings[1].fingerprint
    assert [rings[0].lookup(k) for k in KEYS] == [rings[1].lookup(k) for k in KEYS]
    published = {r.replica_id: r.fingerprint for r in writer.replicas()}
    assert published == {"router-a": rings[0].fingerprint, "router-b": rings[0].fingerprint}


def test_refresh_rebuilds_only_when_membership_changes(
    membership: Membership, clock: ManualClock
) -> None:
    membership.register("w1")
    replica = ReplicaRing(membership, "router-a")
    first = replica.refresh()
    clock.advance(1.0)
    membership.heartbeat("w1")  # a heartbeat is not a membership change
    assert replica.refresh() is first
    membership.register("w2")
    second = replica.refresh()
    assert second is not first and "w2" in second
    assert membership.replicas()[0].fingerprint == second.fingerprint


def test_a_drain_is_acknowledged_only_when_every_live_replica_includes_it(
    membership: Membership, clock: ManualClock
) -> None:
    for name in ("w1", "w2", "w3"):
        membership.register(name)
    a, b = ReplicaRing(membership, "router-a"), ReplicaRing(membership, "router-b")
    a.refresh()
    b.refresh()
    membership.drain("w2")
    status = membership.drain_status("w2")
    assert not status.acknowledged and status.pending == ("router-a", "router-b")
    a.refresh()
    status = membership.drain_status("w2")
    assert not status.acknowledged and status.pending == ("router-b",)
    b.refresh()
    status = membership.drain_status("w2")
    assert status.acknowledged and status.live_replicas == ("router-a", "router-b")
    assert status.pending == ()


def test_a_replica_that_stopped_publishing_does_not_hold_up_a_drain(
    membership: Membership, clock: ManualClock
) -> None:
    for name in ("w1", "w2"):
        membership.register(name)
    a, b = ReplicaRing(membership, "router-a"), ReplicaRing(membership, "router-b")
    a.refresh()
    b.refresh()
    membership.drain("w2")
    clock.advance(TIMEOUT + 1)
    membership.heartbeat("w1")
    membership.heartbeat("w2")
    a.refresh()  # b has gone silent
    status = membership.drain_status("w2")
    assert status.acknowledged and status.live_replicas == ("router-a",)


def test_with_no_live_replica_a_drain_is_not_acknowledged(membership: Membership) -> None:
    membership.register("w1")
    membership.drain("w1")
    status = membership.drain_status("w1")
    assert not status.acknowledged and status.live_replicas == ()
    replica = ReplicaRing(membership, "router-a")
    replica.refresh()
    membership.retire("router-a")
    assert not membership.drain_status("w1").acknowledged


def test_the_default_clock_is_redis_time(redis_client: redis.Redis, key_prefix: str) -> None:
    server = Membership(redis_client, key_prefix, points_per_weight=POINTS)
    server.register("w1")
    (record,) = server.records()
    seconds, micros = redis_client.time()
    assert record.live
    assert abs(record.heartbeat_at - (seconds + micros / 1e6)) < 60


def test_a_corrupt_entry_is_reported_not_guessed(
    membership: Membership, redis_client: redis.Redis
) -> None:
    redis_client.hset(membership.members_key, "w:w1", "heavy")
    with pytest.raises(StoreError, match="w:w1"):
        membership.records()


# --- the CLI ----------------------------------------------------------------------------------


@pytest.fixture
def cli_env(redis_client: redis.Redis, key_prefix: str) -> dict[str, str]:
    url = os.environ.get("REINS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    return {"REINS_REDIS_URL": url, "REINS_KEY_PREFIX": key_prefix}


def test_cli_show_drain_and_remove(
    redis_client: redis.Redis, key_prefix: str, cli_env: dict[str, str]
) -> None:
    workers = Membership(redis_client, key_prefix)  # the CLI's own clock: Redis time
    workers.register("w1")
    workers.register("w2", 2)
    ReplicaRing(workers, "router-a").refresh()
    runner = CliRunner()

    shown = runner.invoke(ring_app, ["show", "--json"], env=cli_env)
    assert shown.exit_code == 0, shown.output
    view = json.loads(shown.output)
    assert view["fingerprint"] == Ring([Member("w1"), Member("w2", 2)]).fingerprint
    assert [(m["name"], m["weight"], m["state"]) for m in view["members"]] == [
        ("w1", 1.0, "active"),
        ("w2", 2.0, "active"),
    ]
    assert view["replicas"] == [
        {"id": "router-a", "fingerprint": view["fingerprint"], "live": True}
    ]

    table = runner.invoke(ring_app, ["show"], env=cli_env)
    assert table.exit_code == 0 and "w2" in table.output and view["fingerprint"] in table.output

    refused = runner.invoke(ring_app, ["remove", "w2"], env=cli_env)
    assert isinstance(refused.exception, RingError) and "not draining" in str(refused.exception)
    assert [r.name for r in workers.records()] == ["w1", "w2"]

    drained = runner.invoke(ring_app, ["drain", "w2"], env=cli_env)
    assert drained.exit_code == 0 and "waiting on replicas router-a" in drained.output
    ReplicaRing(workers, "router-a").refresh()
    again = runner.invoke(ring_app, ["drain", "w2", "--wait", "1"], env=cli_env)
    assert again.exit_code == 0 and "acknowledged by every live replica" in again.output

    removed = runner.invoke(ring_app, ["remove", "w2"], env=cli_env)
    assert removed.exit_code == 0, removed.output
    assert [r.name for r in workers.records()] == ["w1"]


def test_cli_names_an_unknown_member(cli_env: dict[str, str]) -> None:
    result = CliRunner().invoke(ring_app, ["drain", "ghost"], env=cli_env)
    assert isinstance(result.exception, UnknownMember)
    assert "'ghost'" in str(result.exception)


# --- incarnations and progress -------------------------------------------------------------


def test_each_registration_records_its_incarnation(membership: Membership) -> None:
    assert membership.incarnation("w1") is None
    membership.register("w1", incarnation="run-a")
    membership.register("w1", incarnation="run-b")  # the same name, restarted
    assert membership.incarnation("w1") == "run-b"
    assert membership.records()[0].incarnation == "run-b"
    membership.remove("w1")
    assert membership.incarnation("w1") is None


def stalling(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Membership:
    return Membership(
        redis_client,
        key_prefix,
        heartbeat_timeout_s=TIMEOUT,
        stall_timeout_s=3.0,
        clock=clock,
        points_per_weight=POINTS,
    )


def test_a_member_whose_queue_has_work_and_whose_progress_stands_still_is_not_live(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    membership = stalling(redis_client, key_prefix, clock)
    membership.register("w1")
    membership.register("w2")
    for _ in range(5):  # heartbeats keep coming; only w1's consumer takes messages
        clock.advance(1.0)
        taken = int(clock.now)
        membership.heartbeat("w1", Progress(taken=taken, finished=taken, queued=5))
        membership.heartbeat("w2", Progress(taken=7, finished=7, queued=5))
    by_name = {r.name: r for r in membership.records()}
    assert by_name["w1"].live and not by_name["w1"].stalled
    assert by_name["w2"].stalled and not by_name["w2"].live
    assert [m.name for m in membership.build_ring().members] == ["w1"]
    membership.heartbeat("w2", Progress(taken=8, finished=7, queued=5))  # it moved again
    assert {r.name: r.live for r in membership.records()} == {"w1": True, "w2": True}


def test_an_idle_member_with_nothing_queued_is_never_stalled(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    membership = stalling(redis_client, key_prefix, clock)
    membership.register("w1")
    for _ in range(10):
        clock.advance(1.0)
        membership.heartbeat("w1", Progress(taken=3, finished=3, queued=0))
    (record,) = membership.records()
    assert record.live and not record.stalled


# --- retention: lapsed members are deleted after a while ---------------------------------------

RETENTION = 60.0


@pytest.fixture
def retained(membership: Membership, clock: ManualClock) -> Membership:
    """The test's membership, deleting members silent for RETENTION seconds."""
    return Membership(
        membership._client, membership.members_key.removesuffix(":ring:members"),
        heartbeat_timeout_s=TIMEOUT, clock=clock, points_per_weight=POINTS, retention_s=RETENTION,
    )  # fmt: skip


def test_a_member_silent_past_the_retention_is_deleted_whole(
    retained: Membership, clock: ManualClock, redis_client: redis.Redis
) -> None:
    retained.register("old", incarnation="x")
    retained.drain("old")
    retained.register("kept")
    clock.advance(RETENTION / 2)
    retained.heartbeat("kept")
    clock.advance(RETENTION / 2)
    assert retained.prune() == ()  # exactly at the retention: lapsed, still listed
    clock.advance(0.5)
    assert retained.prune() == ("old",)
    assert [r.name for r in retained.records()] == ["kept"]
    assert not any(b"old" in field for field in raw_state(redis_client, retained))
    assert retained.prune() == ()


def test_a_heartbeat_landing_after_the_read_keeps_its_member(
    retained: Membership, clock: ManualClock
) -> None:
    retained.register("w1")
    clock.advance(RETENTION + 1)
    nominated = retained.records()  # w1 is past the retention in this read
    retained.heartbeat("w1")  # ... and heartbeats before the prune runs
    assert retained.prune(nominated) == ()
    assert [r.name for r in retained.records()] == ["w1"]


def test_the_replica_prunes_as_it_refreshes_and_the_ring_keeps_the_live(
    retained: Membership, clock: ManualClock
) -> None:
    for name in ("w1", "w2", "w3"):
        retained.register(name)
    replica = ReplicaRing(retained, "router-a")
    assert len(replica.refresh()) == 3
    clock.advance(RETENTION + 1)
    retained.heartbeat("w1")
    ring = replica.refresh()
    assert [m.name for m in ring.members] == ["w1"]
    assert [r.name for r in retained.records()] == ["w1"]
    assert ring.fingerprint == Ring([Member("w1")], points_per_weight=POINTS).fingerprint
    assert {ring.lookup(k) for k in KEYS} == {"w1"}


def test_a_retention_not_above_the_heartbeat_timeout_is_refused(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    with pytest.raises(ValueError, match="retention_s"):
        Membership(redis_client, key_prefix, heartbeat_timeout_s=5.0, retention_s=5.0)
