"""Mixed versions during a rolling deploy: an older and a newer record schema side by side.

The newer build is simulated by :class:`NextBuildStore`: the same records, stored under the
next schema version (N+1), which it reads along with this build's N (a build that migrates on
write). The router is of the newer build (routers deploy first); of the two workers, ``w1`` is
of the older build (this code as it is: it writes version N) and ``w2`` of the newer. Half the
jobs are submitted before the router switched builds (version N records), half after (N+1).

``w1`` refuses every version-N+1 record it is sent without changing a byte of it and hands the
turn back; the router sends the turn on to ``w2``, never back to ``w1``; version-N records keep
running on ``w1``; every trajectory ends ``done`` with one refund and one email.
"""

from __future__ import annotations

from collections import Counter
from typing import cast

import pytest
import redis

from kernel.errors import SnapshotNotFound
from kernel.record import SCHEMA_VERSION, TrajectoryRecord
from kernel.states import StopReason
from router.placement.membership import Membership
from router.wire.turns import TurnMessage
from store.base import Commit, decode_snapshot
from store.redis_store import RedisStore
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from worker.turn import TurnRunner

pytestmark = pytest.mark.redis
#: This build's schema version and the next build's, as each begins a stored record.
CURRENT = b'{"schema_version":%d,' % SCHEMA_VERSION
NEXT = b'{"schema_version":%d,' % (SCHEMA_VERSION + 1)


class NextBuildStore(RedisStore):
    """The store as the next build sees it: writes schema version N+1, reads N and N+1."""

    def apply(self, commit: Commit) -> int:
        assert commit.snapshot.startswith(CURRENT)
        kept = ("tenant", "trajectory_id", "expected_version", "version", "state", "rows")
        fields = {name: getattr(commit, name) for name in (*kept, "first_row", "commit_id")}
        return super().apply(Commit(**fields, snapshot=NEXT + commit.snapshot[len(CURRENT) :]))

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        version, data = self.raw(tenant, trajectory_id)
        if data.startswith(NEXT):
            data = CURRENT + data[len(NEXT) :]
        return decode_snapshot(tenant, trajectory_id, version, data)

    def raw(self, tenant: str, trajectory_id: str) -> tuple[int, bytes]:
        snap_key = self.trajectory_keys(tenant, trajectory_id)[0]
        got = cast(list[bytes | None], self._client.hmget(snap_key, ["v", "data"]))
        if got[1] is None:
            raise SnapshotNotFound(trajectory_id)
        return int(got[0] or 0), got[1]


def test_an_older_worker_hands_back_a_newer_record_unchanged_and_it_finishes_elsewhere(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    service = inproc.service
    Membership(redis_client, key_prefix).register("w2")
    service.replica.refresh()
    orders = seed_orders(redis_client, key_prefix, 5000, 16)
    old_ids = [inproc.api.submit("acme", refund_job(oid)).trajectory_id for oid in orders[:8]]

    newer = NextBuildStore(redis_client, prefix=key_prefix)
    service.store = service.dispatcher.store = newer  # the router is redeployed first
    api = service.api()
    new_ids = [api.submit("acme", refund_job(oid)).trajectory_id for oid in orders[8:]]
    assert all(newer.raw("acme", t)[1].startswith(CURRENT) for t in old_ids)
    assert all(newer.raw("acme", t)[1].startswith(NEXT) for t in new_ids)

    runners = {
        "w1": inproc.runner,  # the older build: the store as it is, version N
        "w2": TurnRunner(store=newer, tools=inproc.runner.tools, feed=inproc.feed, worker="w2"),
    }
    handed_back: Counter[str] = Counter()
    for _ in range(400):
        service.cycle()
        service.send_on_handbacks()
        sent = [(m, TurnMessage.from_payload(p)) for m, p in inproc.sent]
        inproc.sent.clear()
        if not sent and not inproc.feed.client.xlen(inproc.feed.handbacks_key):
            break
        for member, msg in sent:
            before = newer.raw(msg.tenant, msg.trajectory_id)
            report = runners[member].run(msg)
            if report.reason.startswith("handed back"):
                assert member == "w1" and before[1].startswith(NEXT)
                assert newer.raw(msg.tenant, msg.trajectory_id) == before, "not a byte changed"
                assert report.advanced == 0
                handed_back[msg.trajectory_id] += 1
            elif member == "w1":
                assert before[1].startswith(CURRENT), "w1 only ever carries out version-N records"
    else:
        raise AssertionError("the fleet did not go quiet")

    assert handed_back, "some version-N+1 turn was placed on the older worker"
    assert set(handed_back) <= set(new_ids) | set(old_ids)
    records = [newer.load("acme", t) for t in old_ids + new_ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * 16
    effects = Counter(tuple(e) for e in inproc.state.effects())
    for oid in orders:
        assert effects[("refund", oid, 3000)] == 1 and effects[("email", oid)] == 1


def test_a_turn_every_member_refuses_waits_for_one_that_can_read_it(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    service = inproc.service
    newer = NextBuildStore(redis_client, prefix=key_prefix)
    service.store = service.dispatcher.store = newer
    (oid,) = seed_orders(redis_client, key_prefix, 6000, 1)
    tid = service.api().submit("acme", refund_job(oid)).trajectory_id
    service.cycle()
    ((member, payload),) = inproc.sent
    inproc.sent.clear()
    assert member == "w1"
    inproc.runner.run(TurnMessage.from_payload(payload))  # the older w1 hands it back
    assert service.send_on_handbacks() == 0, "no member but w1, which cannot read it"
    assert inproc.sent == []
    taken = inproc.feed.take_handbacks()
    (waiting,) = taken
    assert waiting.message.refused_by == (), "the refusals are forgotten: the fleet may change"
    inproc.feed.settle_handbacks(taken, again=[waiting])

    Membership(redis_client, key_prefix).register("w2")  # a newer worker joins
    service.replica.refresh()
    w2 = TurnRunner(store=newer, tools=inproc.runner.tools, feed=inproc.feed, worker="w2")
    before = newer.raw("acme", tid)
    for _ in range(3):  # w1 may be tried once more (refusals were forgotten); then never again
        assert service.send_on_handbacks() == 1
        ((member, payload),) = inproc.sent
        inproc.sent.clear()
        msg = TurnMessage.from_payload(payload)
        assert msg.call_id == f"{tid}/m1", "the same call, whoever carries it out"
        if member == "w2":
            break
        assert inproc.runner.run(msg).advanced == 0 and newer.raw("acme", tid) == before
    assert member == "w2" and w2.run(msg).advanced > 0
