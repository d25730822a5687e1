"""`reins ring show` after drains and crashes: draining, dead, gone and recovered members.

The CLI reads the running Redis with Redis's own clock; a dead member is one whose heartbeat the
test backdated, so nothing sleeps.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import redis
from typer.testing import CliRunner

from kernel.errors import StoreError
from ops.cli.ring import ring_app
from ops.cli.ring_view import MemberRow, Recovery, ShownState, member_rows
from router.placement.membership import DrainStatus, MemberRecord, Membership, ReplicaRing
from router.placement.ring import Member, Ring
from router.wire.custody import Custody
from tests.conftest import REDIS_URL


@pytest.fixture
def cli_env(key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REINS_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line, whatever the terminal


def lapse(client: redis.Redis, prefix: str, member: str, seconds: float = 60.0) -> None:
    """Backdate ``member``'s heartbeat by ``seconds`` (it died that long ago)."""
    now, _ = client.time()
    client.hset(Membership(client, prefix).members_key, f"hb:{member}", repr(now - seconds))


def hold(custody: Custody, member: str, *trajectories: str) -> None:
    """Record that the router sent one turn of each trajectory to ``member``."""
    for tid in trajectories:
        payload = {
            "tenant": "acme",
            "trajectory_id": tid,
            "version": 3,
            "epoch": 0,
            "commands": [{"call_id": f"{tid}/m1"}],
        }
        custody.note(member, payload)
    custody.flush()


def recovered(custody: Custody, member: str, *since: float | None) -> None:
    """The reconciler's part: take every holding of ``member`` and record one recovery each."""
    taken = custody.entrusted_to(member)
    assert len(taken) == len(since)
    assert all(custody.take(member, h) for h in taken)
    custody.forget(member)
    custody.record_recoveries(
        [
            {
                "member": member,
                "tenant": h.tenant,
                "trajectory_id": h.trajectory_id,
                "since_heartbeat_s": s,
                "by": "router-a",
            }
            for h, s in zip(taken, since, strict=True)
        ]
    )


def show(*args: str) -> str:
    result = CliRunner().invoke(ring_app, ["show", *args])
    assert result.exit_code == 0, result.output
    return result.output


def row_of(table: str, name: str) -> str:
    (line,) = [line for line in table.splitlines() if re.search(rf"\b{name}\b", line)]
    return line.rstrip()


@pytest.mark.redis
@pytest.mark.usefixtures("cli_env")
def test_show_follows_a_drain_and_a_crash(redis_client: redis.Redis, key_prefix: str) -> None:
    workers = Membership(redis_client, key_prefix)  # the CLI's own clock: Redis time
    custody = Custody(redis_client, key_prefix)
    for name in ("w1", "w2", "w3", "w4", "w5", "w6"):
        workers.register(name)
    workers.drain("w2")
    ReplicaRing(workers, "router-b").refresh()  # sees w2 draining, not yet w3
    workers.drain("w3")
    lapse(redis_client, key_prefix, "w4")
    ReplicaRing(workers, "router-a").refresh()  # sees both drains and w4 out of the ring
    hold(custody, "w1", "t-1")
    # w4 died holding three turns; the reconciler has recovered one so far.
    hold(custody, "w4", "t-2")
    recovered(custody, "w4", 61.5)
    hold(custody, "w4", "t-3", "t-4")
    # w5 was SIGKILLed holding a turn and removed before the reconciler got to it.
    hold(custody, "w5", "t-5")
    workers.remove("w5")
    # w6 was SIGKILLed and removed; all three of its turns were recovered.
    hold(custody, "w6", "t-6", "t-7", "t-8")
    recovered(custody, "w6", 7.25, 9.5, None)
    workers.remove("w6")

    view = json.loads(show("--json"))
    members = {m["name"]: m for m in view["members"]}
    assert [m["name"] for m in view["members"]] == ["w1", "w2", "w3", "w4", "w5", "w6"]
    assert {n: m["state"] for n, m in members.items()} == {
        "w1": "active",
        "w2": "draining",
        "w3": "draining",
        "w4": "dead",
        "w5": "gone",
        "w6": "gone",
    }
    counts = {
        n: (m["in_custody"], m["recovered"], m["worst_recovery_s"]) for n, m in members.items()
    }
    assert counts == {
        "w1": (1, 0, None),
        "w2": (0, 0, None),
        "w3": (0, 0, None),
        "w4": (2, 1, 61.5),
        "w5": (1, 0, None),
        "w6": (0, 3, 9.5),
    }
    assert (members["w2"]["drain_acknowledged"], members["w2"]["drain_pending"]) == (True, [])
    assert (members["w3"]["drain_acknowledged"], members["w3"]["drain_pending"]) == (
        False,
        ["router-b"],
    )
    assert members["w1"]["drain_acknowledged"] is None
    assert members["w4"]["live"] is False and members["w4"]["registered"] is True
    assert 60.0 <= members["w4"]["heartbeat_age_s"] < 120.0
    # Only the live members are on the ring; w1 alone takes new turns, but w2 and w3 keep points.
    assert members["w1"]["share"] == 1.0 and members["w1"]["points"] > 0
    assert members["w2"]["points"] == members["w1"]["points"] and members["w2"]["share"] == 0.0
    for gone in ("w4", "w5", "w6"):
        assert (members[gone]["points"], members[gone]["share"]) == (0, 0.0)
    for gone in ("w5", "w6"):
        assert members[gone]["weight"] is None and members[gone]["registered"] is False

    table = show()
    assert re.search(r"w1 .* active .*│\s+1 │\s+0 │\s+-$", row_of(table, "w1"))
    assert "draining (acknowledged)" in row_of(table, "w2")
    assert "draining (waiting on router-b)" in row_of(table, "w3")
    assert re.search(r"dead \(lapsed 6\ds ago\) .*│\s+2 │\s+1 │\s+61\.50s$", row_of(table, "w4"))
    assert re.search(r"gone \(1 not yet recovered\) .*│\s+1 │\s+0 │\s+-$", row_of(table, "w5"))
    assert re.search(r"gone \(recovered 3\) .*│\s+0 │\s+3 │\s+9\.50s$", row_of(table, "w6"))
    assert "last heartbeat to a recovery" in table


@pytest.mark.redis
@pytest.mark.usefixtures("cli_env")
def test_a_drained_member_that_died_is_dead_and_says_it_was_draining(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    workers = Membership(redis_client, key_prefix)
    workers.register("w1")
    workers.register("w2", 2)
    workers.drain("w2")
    lapse(redis_client, key_prefix, "w2", 30.0)

    (w1, w2) = json.loads(show("--json"))["members"]
    assert (w1["state"], w2["state"], w2["draining"], w2["weight"]) == ("active", "dead", True, 2.0)
    # No replica has published: a drain cannot be acknowledged by nobody.
    assert w2["drain_acknowledged"] is False and w2["drain_pending"] == []
    assert re.search(r"dead \(lapsed 3\ds ago, was draining\)", row_of(show(), "w2"))


@pytest.mark.redis
@pytest.mark.usefixtures("cli_env")
def test_an_empty_fleet_says_so() -> None:
    view = json.loads(show("--json"))
    assert view["members"] == [] and view["replicas"] == []
    table = show()
    assert "no members registered" in table and "no router replica" in table


@pytest.mark.redis
@pytest.mark.usefixtures("cli_env")
def test_a_corrupt_recovery_is_reported_not_skipped(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    custody = Custody(redis_client, key_prefix)
    redis_client.rpush(custody.recoveries_key, json.dumps({"trajectory_id": "t-1"}))
    result = CliRunner().invoke(ring_app, ["show"])
    assert isinstance(result.exception, StoreError)
    assert custody.recoveries_key in str(result.exception)
    assert "not a recovery entry" in str(result.exception)


def test_unreachable_redis_is_one_error_line() -> None:
    # Wide enough that rich does not wrap the one line it prints.
    env = {**os.environ, "REINS_REDIS_URL": "redis://127.0.0.1:1/0", "COLUMNS": "400"}
    p = subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", "ring", "show", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: Redis at redis://127.0.0.1:1/0") and "refused" in line


# --- the view, as a pure function -------------------------------------------------------------

NOW = 1_000.0


def record(
    name: str, *, beat: float = NOW, draining: bool = False, live: bool = True
) -> MemberRecord:
    return MemberRecord(name, 1.0, beat, draining, live)


def rows(
    records: list[MemberRecord],
    drains: dict[str, DrainStatus] | None = None,
    in_custody: dict[str, int] | None = None,
    recoveries: list[Recovery] | None = None,
) -> dict[str, MemberRow]:
    ring = Ring(
        [r.as_member() for r in records if r.live],
        points_per_weight=8,
    )
    out = member_rows(records, ring, drains or {}, in_custody or {}, recoveries or [], NOW)
    return {row.name: row for row in out}


def test_view_orders_registered_members_then_gone_ones_by_name() -> None:
    out = member_rows(
        [record("b"), record("d")],
        Ring([Member("b"), Member("d")], points_per_weight=8),
        {},
        {"a": 1, "c": 0, "e": 2},
        [Recovery("z", 1.0), Recovery("c", None)],
        NOW,
    )
    # "c" holds nothing now but was recovered from; a holder with nothing and no past is left out.
    assert [(r.name, r.state) for r in out] == [
        ("b", ShownState.ACTIVE),
        ("d", ShownState.ACTIVE),
        ("a", ShownState.GONE),
        ("c", ShownState.GONE),
        ("e", ShownState.GONE),
        ("z", ShownState.GONE),
    ]
    assert out[0].share + out[1].share == pytest.approx(1.0)


def test_view_describes_each_drain_outcome() -> None:
    def status(name: str, live: tuple[str, ...], pending: tuple[str, ...]) -> DrainStatus:
        return DrainStatus(name, bool(live) and not pending, live, pending)

    drained = [record(n, draining=True) for n in ("acked", "pending", "alone", "raced")]
    out = rows(
        drained,
        drains={
            "acked": status("acked", ("r1", "r2"), ()),
            "pending": status("pending", ("r1", "r2"), ("r1", "r2")),
            "alone": status("alone", (), ()),
        },
    )
    assert {n: r.describe() for n, r in out.items()} == {
        "acked": "draining (acknowledged)",
        "pending": "draining (waiting on r1, r2)",
        "alone": "draining (no live replica)",
        "raced": "draining",  # removed between the two reads: no status to show
    }
    assert out["raced"].drain_acknowledged is None


def test_view_of_dead_members_and_their_recoveries() -> None:
    out = rows(
        [
            record("beats", beat=NOW - 2.0),
            record("lapsed", beat=NOW - 42.4, live=False),
            record("never", beat=-math.inf, live=False),
        ],
        in_custody={"lapsed": 4, "gone": 1},
        recoveries=[
            Recovery("lapsed", 43.0),
            Recovery("lapsed", None),
            Recovery("lapsed", 44.5),
            Recovery("gone", None),
        ],
    )
    assert out["beats"].describe() == "active" and out["beats"].heartbeat_age_s == 2.0
    lapsed = out["lapsed"]
    assert lapsed.describe() == "dead (lapsed 42s ago)"
    assert (lapsed.in_custody, lapsed.recovered, lapsed.worst_recovery_s) == (4, 3, 44.5)
    assert (lapsed.points, lapsed.share) == (0, 0.0)
    never = out["never"]
    assert never.describe() == "dead (no heartbeat)" and never.heartbeat_age_s is None
    assert never.as_json()["heartbeat_age_s"] is None
    gone = out["gone"]
    assert gone.describe() == "gone (recovered 1, 1 not yet recovered)"
    assert gone.worst_recovery_s is None and gone.as_json()["weight"] is None


def test_view_json_keeps_the_existing_keys() -> None:
    (row,) = rows([record("w1")]).values()
    assert row.as_json() == {
        "name": "w1",
        "weight": 1.0,
        "state": "active",
        "points": 8,
        "share": 1.0,
        "registered": True,
        "live": True,
        "draining": False,
        "heartbeat_age_s": 0.0,
        "drain_acknowledged": None,
        "drain_pending": [],
        "in_custody": 0,
        "recovered": 0,
        "worst_recovery_s": None,
        "stalled": False,
    }


@pytest.mark.parametrize(
    "entry",
    [
        [],
        {"member": 7},
        {"since_heartbeat_s": 1.0},
        {"member": "w1", "since_heartbeat_s": "soon"},
        {"member": "w1", "since_heartbeat_s": True},
    ],
)
def test_a_bad_recovery_entry_is_refused(entry: object) -> None:
    with pytest.raises(ValueError, match=r"recovery entry|not a number"):
        Recovery.parse(entry)


def test_a_recovery_entry_is_read() -> None:
    assert Recovery.parse({"member": "w1", "since_heartbeat_s": 3, "by": "r"}) == Recovery(
        "w1", 3.0
    )
    assert Recovery.parse({"member": "w1", "since_heartbeat_s": None}) == Recovery("w1", None)
