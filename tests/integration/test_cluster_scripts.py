"""Every router script, and the feed's batches, on a real three-master Redis Cluster.

A script whose keys are in two slots fails there (``CROSSSLOT``, redis-py's "all keys must map
to the same key slot", or "Script attempted to access a non local key" when a script reaches a
key it was not given on another master; one on the same master passes, so the tests also check
the slots of every key written), and a batch keeps its order only within one node. Each script of
``router/lua`` (the libraries run inside them), the membership, admitter-lease and custody
scripts runs here at least once through the code that uses it, and the last test checks that
none was left out (it runs last, in file order): a new script needs its line here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from api.keys import KeyRing, Scope
from kernel.errors import StaleNomination, UnknownMember
from router.admission.claims import ReturningCall
from router.admission.redis import gates as redis_gates
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.placement.membership import Membership
from router.process.chores import AdmitterLeadership
from router.wire.custody import Custody
from router.wire.feed import CancelListener, Feed
from router.wire.keyspace import fleet_tag
from router.wire.notices import Notice, NoticeKind
from router.wire.streams import dead_letters
from store.scripts import Script
from tests.quota.test_redis_admitter import CONFIG, GATES, OPENAI
from tests.support import ManualClock, wait_for

pytestmark = pytest.mark.redis
LUA = Path(redis_gates.__file__).parent / "lua"
RAN: set[str] = set()  # the scripts run on the cluster by the tests of this module
#: Scripts a cluster never runs: committed.lua goes only behind a commit on one node (its keys,
#: the snapshot's and the admitter's, are in two slots); on a cluster confirm.lua runs instead.
ONE_NODE = {"committed.lua"}


def lua_mains() -> set[str]:
    """The admitter's files that are scripts of their own, not libraries put before them."""
    return {p.name for p in LUA.glob("*.lua") if "A library" not in p.read_text()[:400]}


def main_scripts() -> set[str]:
    """Every script the router and the workers run: the admitter's, and the others."""
    others = {"set_if_member.lua", "admit_lease.lua"}
    return (
        lua_mains() | others | {"custody_release.lua", "custody_orphan.lua", "custody_forget.lua"}
    )


@pytest.fixture
def cluster(redis_cluster: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    """The cluster client; the main files of every script run through it go into :data:`RAN`
    (every script runs through :meth:`store.scripts.Script.run`)."""
    assert isinstance(redis_cluster, RedisCluster)
    ran, mains = Script.run, main_scripts()

    def running(self: Script, *args: Any, **kwargs: Any) -> Any:
        RAN.update(f for f in self.files if f in mains)
        return ran(self, *args, **kwargs)

    monkeypatch.setattr(Script, "run", running)
    yield redis_cluster


def slot(key: str) -> int:
    return key_slot(key.encode())


def slots_of_keys(client: redis.Redis, prefix: str) -> set[int]:
    """The slots of every key under ``prefix`` on the cluster. Redis refuses a script's key of
    another slot only when another master holds it, so the tests look at what was written."""
    keys = [*client.scan_iter(match=f"{prefix}*"), *client.scan_iter(match=f"{{{prefix}*")]
    return {key_slot(k) for k in keys}


def test_the_admitter_and_gate_scripts_run_in_the_admitters_slot(
    cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    clock = ManualClock(1_000.0)
    gates = RedisGates(cluster, GATES, prefix=cluster_key_prefix, clock=clock)
    gates.configure()  # gate.lua
    admitter = RedisAdmitter(  # init.lua
        cluster, CONFIG, prefix=cluster_key_prefix, clock=clock, gates=gates, claim_ttl_s=5
    )
    for k in range(3):  # enqueue.lua
        admitter.submit("acme", f"a{k}", input_tokens=1_000, output_allowance=500)
    admitter.requeue("globex", "g0", input_tokens=1_000, output_allowance=500, route=OPENAI)

    first = admitter.nominate()  # claim.lua
    assert first is not None
    admitter.confirm(first)  # confirm.lua
    second = admitter.nominate()
    assert second is not None and second.call.trajectory_id != first.call.trajectory_id
    admitter.decline(second)  # resolve.lua
    with pytest.raises(StaleNomination):
        admitter.decline(second)
    assert admitter.withdraw("a2")
    lane = admitter.in_flight_page(0, 0, 16)  # in_flight.lua "page": the first call's lane
    assert lane[0] == 0 and admitter.in_flight("acme") == 1
    assert admitter.release("acme", first.call.trajectory_id)  # in_flight.lua "end"
    assert admitter.in_flight("acme") == 0

    queued, claim = admitter.claim_returning(  # returning.lua
        ReturningCall("acme", first.call.trajectory_id, 1_000, 500, None, None)
    )
    assert queued and claim is not None and claim.call.trajectory_id == first.call.trajectory_id
    clock.advance(10)  # past the claim's deadline: the reconciler requeues it
    done = admitter.reconcile(lambda tenant, tid: True)
    assert done.requeued == (first.call.trajectory_id,)

    assert gates.debit(OPENAI, "lease-1", 2_000).ok
    assert gates.renew(OPENAI, "lease-1")
    gates.settle(OPENAI, "lease-1", 1_500)
    assert gates.reading(OPENAI).leases == 0
    assert slots_of_keys(cluster, cluster_key_prefix) == {slot(admitter.tag)}


def test_membership_and_the_admitter_lease(cluster: redis.Redis, cluster_key_prefix: str) -> None:
    members = Membership(cluster, cluster_key_prefix)
    members.register("w1")
    members.heartbeat("w1")  # set_if_member.lua
    members.remove("w1")  # a transaction on one key
    with pytest.raises(UnknownMember):
        members.heartbeat("w1")  # not a member any more: nothing written
    assert members.records() == ()

    feed = Feed(cluster, cluster_key_prefix)
    lease = AdmitterLeadership(cluster, feed.leadership_key, "r1", ttl_s=30)
    other = AdmitterLeadership(cluster, feed.leadership_key, "r2", ttl_s=30)
    assert lease.take() and not other.take()
    assert lease.renew() and not other.renew()  # admit_lease.lua
    lease.release()
    assert other.take()


def test_custody_scripts_run_in_the_feeds_slot(
    cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    custody = Custody(cluster, cluster_key_prefix)
    payload = {"tenant": "acme", "trajectory_id": "t1", "version": 3, "epoch": 0}
    custody.note("w1", {**payload, "commands": [{"call_id": "t1/m1"}]})
    custody.flush()
    assert custody.release("w1", "acme", "t1", 3)  # custody_release.lua
    custody.note("w1", {**payload, "commands": [{"call_id": "t1/m1"}]})
    custody.flush()
    assert custody.orphan("w1", "w1 (incarnation 0)") == 1  # custody_orphan.lua
    (turn,) = custody.entrusted_to("w1 (incarnation 0)")
    assert custody.take("w1 (incarnation 0)", turn)
    assert custody.forget("w1 (incarnation 0)")  # custody_forget.lua
    assert custody.custodians() == {"w1"}
    assert slots_of_keys(cluster, cluster_key_prefix) == {slot(fleet_tag(cluster_key_prefix))}


def test_the_feed_on_the_cluster_notices_poison_handbacks_and_older_keys(
    cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    feed = Feed(cluster, cluster_key_prefix, router="r1", reclaim_after_s=0)
    feed.create_groups()
    custody = Custody(cluster, cluster_key_prefix)
    notice = Notice(NoticeKind.READY, "acme", "t1", 1)
    custody.note("w1", {"tenant": "acme", "trajectory_id": "t1", "version": 2, "epoch": 0})
    custody.flush()

    pipe = feed.batch()  # a worker's turn ending: the notice, then the release, one node
    feed.push(notice, pipeline=pipe)
    custody.release("w1", "acme", "t1", 2, pipeline=pipe)
    replies = pipe.execute(raise_on_error=False)
    assert custody.released_on(replies[-1], "w1", "acme", "t1", 2)

    cluster.xadd(feed.notices_key, {"v": b"not a notice"})
    taken = feed.take()
    assert [n.trajectory_id for n in taken] == ["t1"]
    assert [d.raw for d in dead_letters(cluster, feed.dead_key, 10)] == [b"not a notice"]
    feed.done(taken)
    feed.flush()
    assert feed.depth() == 0

    old_notices, _ = feed.legacy_streams  # an older worker's append, before the tag
    cluster.xadd(old_notices, {"v": Notice(NoticeKind.READY, "acme", "t2", 1).encode()})
    assert feed.drain_legacy() == 1
    assert cluster.xlen(old_notices) == 0
    assert [n.trajectory_id for n in feed.take()] == ["t2"]
    assert set(feed.lag()) == {"notices", "handbacks"}
    cluster.delete(old_notices)  # empty now; the only key of another slot
    assert slots_of_keys(cluster, cluster_key_prefix) == {slot(fleet_tag(cluster_key_prefix))}


def test_a_cancel_published_on_the_cluster_is_heard(
    cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    feed = Feed(cluster, cluster_key_prefix)
    heard: list[str] = []
    done = threading.Event()

    def on_cancel(call_id: str) -> None:
        heard.append(call_id)
        done.set()

    listener = CancelListener(feed, on_cancel)
    listener.start()
    try:
        assert listener.subscribed.wait(10)

        def published() -> bool:
            feed.publish_cancel("acme", "t1", "t1/m1")
            return done.wait(0.2)

        wait_for(published, 10, "the cancel to be heard")
    finally:
        listener.stop()
    assert heard[0] == "t1/m1"


def test_api_keys_are_created_and_revoked_on_the_cluster(
    redis_cluster: redis.Redis, cluster_key_prefix: str
) -> None:
    ring = KeyRing(redis_cluster, cluster_key_prefix)  # its grants and its index: two slots
    key, grant = ring.create("acme", "reviewer", {Scope.READ})
    assert ring.verify(key) == grant and ring.grants() == [grant]
    assert ring.revoke(grant.key_id)
    assert ring.verify(key) is None and ring.grants() == []
    assert not ring.revoke(grant.key_id)


def test_every_router_script_ran_on_the_cluster() -> None:
    missing = main_scripts() - RAN - ONE_NODE
    assert not missing, f"scripts never run on the cluster by this module: {sorted(missing)}"
