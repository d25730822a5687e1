"""The durable feed on the real Redis: a notice is acknowledged only once its effect is durable,
a poison entry goes to the dead letters and the rest of its batch proceeds, a router's pending
notices are taken over by another, and a notice acted on twice changes nothing.

The trajectories whose notices are tested are *stranded* first: READY, with no queue entry (as
after a lost notice), so only their notice can bring them to an end.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.errors import StoreUnavailable
from kernel.states import StopReason
from ops.observability.metrics import Metrics
from router.placement.membership import Membership
from router.process.service import AdmitterKind, RouterOptions, RouterService
from router.wire.feed import Feed
from router.wire.notices import Notice, NoticeKind, ready_notice
from router.wire.streams import FIELD, GROUP, GroupLag, dead_letters, pending_counts
from router.wire.turns import HandBack, HandBackWhy
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders

pytestmark = pytest.mark.redis


def stranded(fleet: InProcessFleet, first: int, count: int) -> list[str]:
    """``count`` refund trajectories of acme, READY and in no queue: only a notice saves them."""
    orders = seed_orders(fleet.client, fleet.prefix, first, count)
    ids = [fleet.api.submit("acme", refund_job(oid)).trajectory_id for oid in orders]
    fleet.client.delete(fleet.feed.notices_key)  # a local admitter's submission notices: lost
    fleet.feed.create_groups()
    admitter: Any = fleet.service.dispatcher.admitter
    for tid in ids:
        admitter.withdraw(tid)
        assert not admitter.is_queued(tid)
    return ids


def notices_of(fleet: InProcessFleet, ids: list[str]) -> list[Notice]:
    return [ready_notice(fleet.load("acme", t), "", 0.0) for t in ids]


def states(fleet: InProcessFleet, ids: list[str]) -> Counter[str]:
    return Counter(fleet.load("acme", t).state.value for t in ids)


def all_done(fleet: InProcessFleet, ids: list[str]) -> bool:
    return all(fleet.load("acme", t).stop_reason is StopReason.DONE for t in ids)


def one_refund_and_email_each(fleet: InProcessFleet) -> None:
    effects: dict[str, Counter[str]] = {}
    for kind, order, *_ in fleet.state.effects():
        effects.setdefault(str(order), Counter())[str(kind)] += 1
    assert effects and all(c == Counter(refund=1, email=1) for c in effects.values()), effects


def left_in(client: redis.Redis, feed: Feed) -> tuple[int, dict[str, int]]:
    """What is left of the notices: entries in the stream, pending entries per router."""
    return int(client.xlen(feed.notices_key)), pending_counts(client, feed.notices_key)


def second_router(fleet: InProcessFleet, tenants_file: Path, name: str = "r2") -> RouterService:
    """Another router on the same Redis, sending through the same collector as ``fleet``'s."""
    options = RouterOptions(name=name, tenants_file=str(tenants_file), admitter=AdmitterKind.REDIS)
    service = RouterService(
        fleet.settings, options, client=fleet.client, sender=lambda m, p: fleet.sent.append((m, p))
    )
    service.tick()  # its ring
    return service


def run_on(fleet: InProcessFleet, service: RouterService, rounds: int = 500) -> None:
    """``service`` admits, ``fleet``'s turn runner runs, until nothing is left."""
    for _ in range(rounds):
        busy = service.cycle()
        messages = fleet.take()
        for msg in messages:
            fleet.runner.run(msg)
        if not busy and not messages:
            return
    raise AssertionError("not quiet")


# --- the reader's contract -----------------------------------------------------------------------


def test_what_is_taken_stays_pending_until_done_and_is_acked_with_the_next_take(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    feed = Feed(redis_client, key_prefix, router="r1")
    feed.create_groups()

    def notice(n: int) -> Notice:
        return Notice(NoticeKind.READY, "acme", f"t{n}", 1)

    def tids(taken: Any) -> list[str]:
        return [n.trajectory_id for n in taken]

    feed.push(notice(1), notice(2))
    assert tids(feed.take(10)) == ["t1", "t2"]
    feed.push(notice(3))
    assert tids(feed.take(10, more=True)) == ["t3"], "more: only new entries"
    again = feed.take(10)  # none was done: they count as left, and come back first
    assert tids(again) == ["t1", "t2", "t3"]
    assert pending_counts(redis_client, feed.notices_key) == {"r1": 3}
    feed.done(again)
    assert pending_counts(redis_client, feed.notices_key) == {"r1": 3}, "acked with the next take"
    feed.push(notice(4))
    assert tids(feed.take(10)) == ["t4"]
    assert left_in(redis_client, feed) == (1, {"r1": 1}), "t1..t3 acknowledged and deleted"


def test_the_lag_counts_what_no_router_took_and_what_none_acknowledged(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    feed = Feed(redis_client, key_prefix, router="r1")
    assert feed.lag() == {}, "no stream yet: nothing to report"
    feed.create_groups()
    feed.push(*(Notice(NoticeKind.READY, "acme", f"t{n}", 1) for n in range(5)))
    assert feed.lag()["notices"] == GroupLag(lag=5, pending=0)
    taken = feed.take(3)
    assert feed.lag()["notices"] == GroupLag(lag=2, pending=3)
    feed.done(taken)
    feed.take(10)  # acknowledges the done ones, takes the rest
    assert feed.lag()["notices"] == GroupLag(lag=0, pending=2)
    assert feed.lag()["handbacks"] == GroupLag(lag=0, pending=0)


# --- poison --------------------------------------------------------------------------------------

NEWER = json.dumps(["ready", "acme", "t-new", 3, "", 10, 10, 0.0, "", "", "", -1, "", "shape"])
POISON = [b"not json at all", b'["ready", "acme"]', NEWER.encode(), b'["ready",1,2,"3"]']


def test_a_poison_notice_goes_to_the_dead_letters_and_its_batch_proceeds(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    metrics = Metrics(process_metrics=False)
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, observer=metrics)
    ids = stranded(fleet, 100, 4)
    feed = fleet.feed
    pipe = redis_client.pipeline(transaction=False)
    for notice, bad in zip(notices_of(fleet, ids), POISON, strict=True):
        pipe.xadd(feed.notices_key, {FIELD: notice.encode()})
        pipe.xadd(feed.notices_key, {FIELD: bad})
    pipe.xadd(feed.notices_key, {b"other": b"field"})
    pipe.execute()

    fleet.run_until_quiet()

    assert all_done(fleet, ids), states(fleet, ids)
    one_refund_and_email_each(fleet)
    dead = dead_letters(redis_client, feed.dead_key, 100)
    assert sorted(d.raw for d in dead) == sorted([*POISON, b"[b'other', b'field']"])
    assert {(d.source, d.stream) for d in dead} == {("notices", feed.notices_key)}
    assert all("malformed notice" in d.error for d in dead if d.raw in POISON)
    assert [d.error for d in dead if d.raw.startswith(b"[b'other'")] == [
        "entry without a 'v' field"
    ]
    order = [tuple(int(part) for part in d.id.split("-")) for d in dead]
    assert order == sorted(order, reverse=True), "newest first"
    got = metrics.registry.get_sample_value("reins_poison_notices_total", {"source": "notices"})
    assert got == 5
    fleet.service.feed.flush()
    assert left_in(redis_client, feed) == (0, {}), "every notice acknowledged and deleted"


def test_a_poison_hand_back_goes_to_the_dead_letters_and_a_good_one_is_sent_on(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    Membership(redis_client, key_prefix).register("w2")
    inproc.service.replica.refresh()
    (oid,) = seed_orders(redis_client, key_prefix, 200, 1)
    inproc.api.submit("acme", refund_job(oid))
    inproc.cycle()
    (msg,) = inproc.take()
    redis_client.xadd(inproc.feed.handbacks_key, {FIELD: b'{"member": "w1"}'})
    inproc.runner.hand_back(msg, HandBackWhy.DRAINING)

    assert inproc.service.send_on_handbacks() == 1
    ((member, payload),) = inproc.sent
    assert member != msg.sent_by and payload["trajectory_id"] == msg.trajectory_id
    (dead,) = dead_letters(redis_client, inproc.feed.dead_key, 10)
    assert (dead.source, dead.raw) == ("handbacks", b'{"member": "w1"}')
    assert "malformed hand-back" in dead.error
    assert redis_client.xlen(inproc.feed.handbacks_key) == 0
    assert pending_counts(redis_client, inproc.feed.handbacks_key) == {}


# --- a rolling upgrade ------------------------------------------------------------------------


def format_1(n: Notice) -> bytes:
    """``n`` as the build before notices had a format wrote it: its fields in order in one
    array, the trailing ones after ``used_tokens`` left out while at their defaults."""
    fields = (
        *(n.kind.value, n.tenant, n.trajectory_id, n.version, n.call_id, n.input_tokens),
        *(n.output_allowance, n.at, n.route, n.lease, n.lease_route, n.used_tokens),
        *(n.service_class, n.retry_after_s, n.rate_limits),
    )
    at = len(fields)
    while at > 12 and fields[at - 1] in ("", -1.0, {}):
        at -= 1
    return json.dumps(fields[:at], separators=(",", ":")).encode()


def test_notices_an_older_worker_wrote_by_position_are_acted_on(
    inproc: InProcessFleet, redis_client: redis.Redis
) -> None:
    ids = stranded(inproc, 250, 4)
    old = notices_of(inproc, ids[:2])
    new = notices_of(inproc, ids[2:])
    for n in old:  # written by a worker of the build before, while this router runs
        redis_client.xadd(inproc.feed.notices_key, {FIELD: format_1(n)})
    inproc.feed.push(*new)
    raw = [fields[FIELD] for _, fields in redis_client.xrange(inproc.feed.notices_key)]
    assert sum(r.startswith(b"[") for r in raw) == 2, "two positional, two by name"

    inproc.run_until_quiet()
    assert all_done(inproc, ids), states(inproc, ids)
    one_refund_and_email_each(inproc)
    assert dead_letters(redis_client, inproc.feed.dead_key, 10) == [], "none set aside"


# --- taken, not acknowledged ---------------------------------------------------------------------


def test_notices_whose_requeue_failed_stay_pending_and_the_next_cycle_acts_on_them(
    inproc: InProcessFleet, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = stranded(inproc, 300, 3)
    inproc.feed.push(*notices_of(inproc, ids))
    admitter: Any = inproc.service.dispatcher.admitter
    requeue_many, failures = admitter.requeue_many, []

    def failing_once(calls: Any) -> Any:
        if not failures:
            failures.append(list(calls))
            raise StoreUnavailable("the admitter's Redis went away")
        return requeue_many(calls)

    monkeypatch.setattr(admitter, "requeue_many", failing_once)
    with pytest.raises(StoreUnavailable):
        inproc.cycle()
    assert left_in(redis_client, inproc.feed) == (3, {"r1": 3}), "taken, not acknowledged"
    assert not any(admitter.is_queued(t) for t in ids)

    inproc.run_until_quiet()
    assert len(failures) == 1 and all_done(inproc, ids), states(inproc, ids)
    one_refund_and_email_each(inproc)
    inproc.service.feed.flush()
    assert left_in(redis_client, inproc.feed) == (0, {})


def test_a_dead_routers_pending_notices_are_taken_over_by_another_router(
    inproc: InProcessFleet, redis_client: redis.Redis, tenants_file: Path
) -> None:
    ids = stranded(inproc, 400, 3)
    inproc.feed.push(*notices_of(inproc, ids))
    assert len(inproc.feed.take()) == 3  # r1 takes them ... and dies before it acts on them
    r2 = second_router(inproc, tenants_file)
    r2.cycle()
    assert inproc.take() == [] and left_in(redis_client, inproc.feed)[1] == {"r1": 3}

    r2.feed.notices.reclaim_after_ms = 0  # r1 has been idle long enough (no clock to wait on)
    assert r2.reclaim_notices() == 3
    assert pending_counts(redis_client, inproc.feed.notices_key) == {"r2": 3}
    run_on(inproc, r2)
    assert all_done(inproc, ids), states(inproc, ids)
    one_refund_and_email_each(inproc)
    r2.feed.flush()
    assert left_in(redis_client, inproc.feed) == (0, {})


def test_a_router_restarted_under_its_name_acts_first_on_what_it_left_pending(
    inproc: InProcessFleet, redis_client: redis.Redis, tenants_file: Path
) -> None:
    ids = stranded(inproc, 500, 2)
    inproc.feed.push(*notices_of(inproc, ids))
    assert len(inproc.feed.take()) == 2  # r1 dies here; a new r1 boots
    again = second_router(inproc, tenants_file, name="r1")
    run_on(inproc, again)
    assert all_done(inproc, ids), states(inproc, ids)
    again.feed.flush()
    assert left_in(redis_client, inproc.feed) == (0, {})


def test_a_hand_back_that_could_not_be_sent_on_is_sent_by_the_next_tick(
    inproc: InProcessFleet,
    redis_client: redis.Redis,
    key_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Membership(redis_client, key_prefix).register("w2")
    inproc.service.replica.refresh()
    (oid,) = seed_orders(redis_client, key_prefix, 600, 1)
    inproc.api.submit("acme", refund_job(oid))
    inproc.cycle()
    (msg,) = inproc.take()
    inproc.runner.hand_back(msg, HandBackWhy.DRAINING)
    outbox = inproc.service.outbox
    flush = outbox.flush

    def broker_down() -> None:
        raise StoreUnavailable("the broker went away")

    monkeypatch.setattr(outbox, "flush", broker_down)
    with pytest.raises(StoreUnavailable):
        inproc.service.send_on_handbacks()
    assert pending_counts(redis_client, inproc.feed.handbacks_key) == {"r1": 1}

    monkeypatch.setattr(outbox, "flush", flush)
    inproc.sent.clear()
    assert inproc.service.send_on_handbacks() == 1
    ((member, payload),) = inproc.sent
    assert member == "w2" and payload["trajectory_id"] == msg.trajectory_id
    assert redis_client.xlen(inproc.feed.handbacks_key) == 0
    assert pending_counts(redis_client, inproc.feed.handbacks_key) == {}


# --- duplicates ----------------------------------------------------------------------------------


@pytest.mark.parametrize("admitter", ["redis", "drr", "fifo"])
def test_a_notice_acted_on_twice_queues_and_admits_once(
    admitter: str, redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, admitter=admitter)
    ids = stranded(fleet, 700, 4)
    notices = notices_of(fleet, ids)
    d = fleet.service.dispatcher
    d.intake(notices)
    d.intake(notices)  # the same notices again: a reclaim after a router acted but did not ack
    depths = [t.queue_depth for t in d.admitter.figures().tenants]
    assert sum(depths) == len(ids), f"each trajectory queued once: {depths}"

    fleet.feed.push(*notices, *notices)  # and twice more through the feed
    fleet.cycle()
    messages = fleet.take()
    assert Counter(m.trajectory_id for m in messages) == Counter(ids), "each admitted once"
    fleet.feed.push(*notices)  # stale by now: their records have moved on
    for msg in messages:
        fleet.runner.run(msg)
    fleet.run_until_quiet()
    assert all_done(fleet, ids), states(fleet, ids)
    one_refund_and_email_each(fleet)


# --- a Redis that lost its data; the lists of the build before streams ---------------------------


def test_the_group_is_created_again_when_redis_lost_it(
    inproc: InProcessFleet, redis_client: redis.Redis
) -> None:
    ids = stranded(inproc, 800, 2)
    redis_client.delete(inproc.feed.notices_key, inproc.feed.handbacks_key)  # a flushed Redis
    inproc.feed.push(*notices_of(inproc, ids))  # written before any router saw the loss
    assert inproc.service.send_on_handbacks() == 0  # finds the group gone: creates it again
    assert inproc.cycle() is False  # likewise
    inproc.run_until_quiet()
    assert all_done(inproc, ids), states(inproc, ids)
    groups = redis_client.xinfo_groups(inproc.feed.notices_key)
    assert [g["name"] for g in groups] == [GROUP.encode()]


def test_entries_left_on_the_old_lists_are_moved_into_the_streams(
    inproc: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    ids = stranded(inproc, 900, 2)
    (oid,) = seed_orders(redis_client, key_prefix, 950, 1)
    handed = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    inproc.cycle()
    (msg,) = inproc.take()  # its worker, of the build before streams, hands it back
    ready_list, handback_list = inproc.feed.legacy_keys
    assert (ready_list, handback_list) == (
        f"{key_prefix}:fleet:ready",
        f"{key_prefix}:fleet:handback",
    )
    redis_client.rpush(ready_list, *(n.encode() for n in notices_of(inproc, ids)))
    redis_client.rpush(handback_list, HandBack("w0", HandBackWhy.DRAINING, msg).encode())

    inproc.service.tick()
    assert not redis_client.exists(ready_list, handback_list)
    assert [p["trajectory_id"] for _, p in inproc.sent] == [handed], "sent on"
    inproc.run_until_quiet()
    assert all_done(inproc, [*ids, handed]), states(inproc, [*ids, handed])
