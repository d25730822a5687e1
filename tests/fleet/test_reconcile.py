"""The reconciler in one process on the real Redis: custody, lapse, recovery, stale messages.

The router's sender only collects messages (no Celery); the test decides which member's turn
runner carries out which message, and makes a member lapse by backdating its heartbeat.
"""

from __future__ import annotations

import socket
from collections import Counter
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError
from redis.retry import Retry

from kernel.errors import StoreUnavailable
from kernel.record import OpStatus
from kernel.states import LifecycleState, StopReason
from router.placement.membership import Membership
from router.process.reconcile import Reconciler
from router.wire.custody import Custody
from router.wire.feed import Feed
from router.wire.notices import Notice
from router.wire.turns import TurnMessage
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from worker.turn import TurnRunner

pytestmark = pytest.mark.redis
S = LifecycleState


def runner_of(inproc: InProcessFleet, member: str, feed: Feed | None = None) -> TurnRunner:
    """A turn runner for ``member`` that releases its custody, as a fleet worker's does (on
    ``feed``, the fleet's unless given)."""
    return TurnRunner(
        store=inproc.store,
        tools=inproc.runner.tools,
        feed=feed or inproc.feed,
        worker=member,
        custody=inproc.service.custody,
    )


def lapse(client: redis.Redis, prefix: str, member: str) -> None:
    """Backdate ``member``'s heartbeat far past the timeout (it died a while ago)."""
    seconds, _ = client.time()
    client.hset(Membership(client, prefix).members_key, f"hb:{member}", repr(seconds - 60.0))


def held_ids(custody: Custody, member: str) -> set[str]:
    return {h.trajectory_id for h in custody.entrusted_to(member)}


def test_a_sent_turn_is_held_until_its_worker_pushed_the_notice(inproc: InProcessFleet) -> None:
    custody = inproc.service.custody
    oid = seed_orders(inproc.client, inproc.prefix, 100, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()
    (held,) = custody.entrusted_to("w1")
    assert (held.trajectory_id, held.version, held.call_id) == (tid, msg.version, msg.call_id)
    assert custody.custodians() == {"w1"}
    assert not custody.release("w1", "acme", tid, msg.version - 1), "another version: kept"
    runner_of(inproc, "w1").run(msg)
    assert custody.entrusted_to("w1") == [], "released once the notice is pushed"
    assert custody.forget("w1") and custody.custodians() == set()


def test_a_release_queued_on_a_pipeline_is_finished_from_its_reply(inproc: InProcessFleet) -> None:
    custody = inproc.service.custody
    oid = seed_orders(inproc.client, inproc.prefix, 150, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()
    turn = ("w1", "acme", tid, msg.version)
    for _ in range(2):  # the first may meet a server that has not loaded the script yet
        assert held_ids(custody, "w1") == {tid}
        pipe = inproc.client.pipeline(transaction=False)
        custody.release(*turn, pipeline=pipe)
        (reply,) = pipe.execute(raise_on_error=False)
        assert custody.released_on(reply, *turn), f"released (reply {reply!r})"
        assert custody.entrusted_to("w1") == []
        custody.note("w1", msg.to_payload())
        custody.flush()
    # A server that lost the script (restarted, flushed): loaded again, released once more.
    assert custody.released_on(NoScriptError("NOSCRIPT No matching script."), *turn)
    assert custody.entrusted_to("w1") == []
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        custody.released_on(ResponseError("WRONGTYPE"), *turn)


def test_a_lapsed_members_turns_are_recovered_and_finish_on_another_member(
    inproc: InProcessFleet, caplog: pytest.LogCaptureFixture
) -> None:
    client, prefix, custody = inproc.client, inproc.prefix, inproc.service.custody
    orders = seed_orders(client, prefix, 200, 4)
    ids = [inproc.api.submit("acme", refund_job(oid)).trajectory_id for oid in orders]
    w1 = runner_of(inproc, "w1")
    # Every trajectory's first turn is sent to w1 (the only member).
    inproc.cycle()
    first = {m.trajectory_id: m for m in inproc.take()}
    assert set(first) == set(ids) and held_ids(custody, "w1") == set(ids)

    # ids[0]: w1 ran the turn and pushed its notice (released): not w1's any more.
    w1.run(first[ids[0]])
    # ids[1]: w1 ran the turn; its next one goes to w1 too (below) and is never taken.
    w1.run(first[ids[1]])
    # ids[2]: w1 got as far as the refund (registered and sent) and died before its result.
    backend, real_call = inproc.backend, inproc.backend.call

    class Dies(BaseException):
        pass

    def dies(user: str, tool: str, args: dict[str, Any], key: str, *a: Any, **kw: Any) -> Any:
        out = real_call(user, tool, args, key, *a, **kw)
        if tool == "issue_refund":
            raise Dies
        return out

    backend.call = dies  # type: ignore[method-assign]
    msg: TurnMessage | None = first[ids[2]]
    while msg is not None:  # carry ids[2] on w1 until it dies in the refund
        try:
            w1.run(msg)
        except Dies:
            break
        inproc.cycle()
        sent = [m for m in inproc.take() if m.trajectory_id == ids[2]]
        msg = sent[0] if sent else None
    backend.call = real_call  # type: ignore[method-assign]
    assert inproc.load("acme", ids[2]).state is S.WAITING_TOOL
    # ids[3]: its message was sent to w1 and never taken.
    assert {ids[1], ids[2], ids[3]} <= held_ids(custody, "w1")
    inproc.take()  # other turns admitted meanwhile went to w1 too; they are stranded as well

    Membership(client, prefix).register("w2")
    lapse(client, prefix, "w1")
    inproc.service.replica.refresh()
    assert [m.name for m in inproc.service.replica.ring.members] == ["w2"]
    other = Reconciler(
        inproc.api, inproc.service.membership, custody, lambda: inproc.service.replica.ring, "r2"
    )
    stranded_before = held_ids(custody, "w1")
    recovered = inproc.service.reconciler.tick() + other.tick()
    assert sorted(recovered) == sorted(set(recovered)), "each turn recovered once"
    assert ids[2] in recovered and ids[3] in recovered
    assert set(recovered) <= stranded_before and custody.entrusted_to("w1") == []
    rec3 = inproc.load("acme", ids[3])
    assert rec3.state is S.READY
    assert rec3.operations[first[ids[3]].call_id].status is OpStatus.UNKNOWN, "reservation kept"

    figures = custody.recoveries()
    assert {e["trajectory_id"] for e in figures} == set(recovered)
    assert all(e["member"] == "w1" and e["since_heartbeat_s"] >= 0 for e in figures)

    # The stale messages of w1, if the broker ever redelivers them, change nothing.
    for tid in (ids[2], ids[3]):
        before = inproc.load("acme", tid)
        report = runner_of(inproc, "w1").run(first[tid], redelivered=True)
        assert report.advanced == 0 and inproc.load("acme", tid) == before

    # Everything left now runs on w2 (the lookup of ids[2]'s refund first).
    w2 = runner_of(inproc, "w2")
    for _ in range(200):
        inproc.cycle()
        sent = inproc.take()
        if not sent:
            break
        for m in sent:
            w2.run(m)
    records = [inproc.load("acme", tid) for tid in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * 4
    effects = Counter(tuple(e) for e in inproc.state.effects())
    for oid in orders:
        assert effects[("refund", oid, 3000)] == 1 and effects[("email", oid)] == 1
    assert held_ids(custody, "w2") == set(), "every turn on w2 released"


def test_a_live_members_holdings_are_left_alone(inproc: InProcessFleet) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 300, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()
    assert inproc.service.reconciler.tick() == []
    assert held_ids(inproc.service.custody, "w1") == {tid}
    assert inproc.load("acme", tid).record_version == msg.version


def test_a_holding_whose_turn_moved_on_is_dropped_without_a_recovery(
    inproc: InProcessFleet,
) -> None:
    custody = inproc.service.custody
    oid = seed_orders(inproc.client, inproc.prefix, 400, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()
    inproc.runner.run(msg)  # w1 pushed the notice and died before its release
    assert held_ids(custody, "w1") == {tid}
    Membership(inproc.client, inproc.prefix).register("w2")
    lapse(inproc.client, inproc.prefix, "w1")
    inproc.service.replica.refresh()
    before = inproc.load("acme", tid)
    assert before.state is S.READY and before.record_version > msg.version
    assert inproc.service.reconciler.tick() == []
    assert custody.entrusted_to("w1") == [] and inproc.load("acme", tid) == before
    assert custody.recoveries() == []


def test_a_turn_that_ended_ready_whose_notice_died_with_its_member_is_queued_again(
    inproc: InProcessFleet,
) -> None:
    """The member committed READY and was killed before it pushed the notice: without the
    reconciler nothing would ever queue the trajectory again."""
    custody = inproc.service.custody
    oid = seed_orders(inproc.client, inproc.prefix, 450, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()

    class Killed(BaseException):
        pass

    class DiesAtTheNotice(Feed):
        def push(self, *notices: Notice, pipeline: Any = None) -> None:
            raise Killed

    w1 = runner_of(inproc, "w1", DiesAtTheNotice(inproc.client, inproc.prefix))
    with pytest.raises(Killed):
        w1.run(msg)
    before = inproc.load("acme", tid)
    assert before.state is S.READY and held_ids(custody, "w1") == {tid}
    inproc.cycle()
    assert inproc.take() == [], "no notice: nothing queued it"

    Membership(inproc.client, inproc.prefix).register("w2")
    lapse(inproc.client, inproc.prefix, "w1")
    inproc.service.replica.refresh()
    assert inproc.service.reconciler.tick() == [], "not a recovery: the record is left as it is"
    assert inproc.load("acme", tid) == before and custody.entrusted_to("w1") == []
    inproc.cycle()
    assert [m for m, _ in inproc.sent] == ["w2"], "admitted again, on the live member"
    (nxt,) = inproc.take()
    assert (nxt.trajectory_id, nxt.version) == (tid, before.record_version + 1)


def test_a_lapsed_member_still_on_this_routers_ring_is_not_reconciled_yet(
    inproc: InProcessFleet,
) -> None:
    """Otherwise a recovered turn could be placed on the dead member again."""
    oid = seed_orders(inproc.client, inproc.prefix, 500, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    inproc.take()
    Membership(inproc.client, inproc.prefix).register("w2")
    lapse(inproc.client, inproc.prefix, "w1")  # the ring is not rebuilt yet: w1 is on it
    assert "w1" in {m.name for m in inproc.service.replica.ring.members}
    assert inproc.service.reconciler.tick() == []
    inproc.service.replica.refresh()
    assert inproc.service.reconciler.tick() == [tid]
    inproc.cycle()
    assert {m for m, _ in inproc.sent} == {"w2"}, "the recovered turn goes to the live member"


def test_holdings_that_cannot_be_written_stay_buffered_and_nothing_is_sent(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    gone = redis.Redis(host="127.0.0.1", port=port, retry=Retry(NoBackoff(), 0))
    custody = Custody(gone, key_prefix)
    sent: list[str] = []
    send = custody.sending(lambda member, payload: sent.append(member))
    payload = {"tenant": "acme", "trajectory_id": "t1", "version": 3, "epoch": 0, "commands": []}
    with pytest.raises(StoreUnavailable, match="writing the custody"):
        send("w1", payload)
    assert sent == [], "register before send: no holding, no message"
    custody.client = redis_client  # Redis is back: the kept holding is written first
    send("w2", {**payload, "trajectory_id": "t2"})
    assert sent == ["w2"]
    assert held_ids(custody, "w1") == {"t1"} and held_ids(custody, "w2") == {"t2"}
