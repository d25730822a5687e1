"""Faults on real processes and the real Redis: nothing is stranded, nothing runs twice.

Each test starts routers and Celery workers as processes (``ops.local.fleet``), submits refunds,
injects one fault from outside (a black-holed Redis connection, a worker SIGKILLed and started
again under its name, a worker whose consumer is wedged while its heartbeat goes on, the notice
feed destroyed under load) and ends with every trajectory terminal, the support store's effects
at most one refund and one email per order, and the time to recovery printed (a figure, never
asserted). The broker's visibility timeout is far past the end of each test, so no recovery is
the broker's redelivery: each is reins's own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path

import pytest
import redis

from kernel.states import TERMINAL
from ops.local.fleet import LocalFleet
from router.placement.membership import Membership
from router.wire.custody import Custody
from router.wire.feed import Feed
from router.wire.streams import FIELD, dead_letters
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.fleet.brokers import AMQP_URL, delete_member_queues, require_rabbitmq
from tests.fleet.conftest import WEIGHTS
from tests.fleet.faults import answering_key
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    KERNEL_ALONE,
    ROOMY_TOTAL,
    UNDEDUPLICATED,
    caller_api,
    sent_twice,
    start,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for
from tests.support.proxy import BlackHoleProxy

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TEST_DB = int(REDIS_URL.rsplit("/", 1)[1] or 0)  # the test suite's database, through the proxy
FAULT_ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_MAX_TURN_S": "3",
    "REINS_STALL_TIMEOUT_S": "4",
    "REINS_SCRIPTED_LATENCY_S": "0.3",
    **KERNEL_ALONE,
}


class Faulty:
    """One fleet under its own prefix, its submissions, and what a test checks at the end."""

    def __init__(self, env: dict[str, str], log_dir: Path, client: redis.Redis) -> None:
        log_dir.mkdir(exist_ok=True)
        self.env, self.client = env, client
        self.prefix = env["REINS_KEY_PREFIX"]
        self.fleet = LocalFleet(env, log_dir, client)
        self.store = RedisStore(client, prefix=self.prefix)
        self.custody = Custody(client, self.prefix)
        self.ids: list[tuple[str, str]] = []

    def submit(self, count: int, first_order: int) -> None:
        api = caller_api({**self.env, "REINS_REDIS_URL": REDIS_URL}, self.client, "redis", None)
        orders = seed_orders(self.client, self.prefix, first_order, count, total=ROOMY_TOTAL)
        self.ids += submit_refunds(api, orders, list(WEIGHTS))

    def ended(self, timeout_s: float = 120) -> float:
        """Wait until every trajectory ended; check the effects; the seconds it took."""
        began = time.monotonic()
        wait_all_ended(self.store, self.ids, timeout_s, self.fleet)
        took = time.monotonic() - began
        records = [self.store.load(t, i) for t, i in self.ids]
        assert all(r.state in TERMINAL for r in records)
        twice = sent_twice(self.client, self.prefix)
        assert twice == {}, f"a write was sent twice: {twice}"
        return took


@pytest.fixture
def faulty(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> Iterator[Faulty]:
    yield from _faulty({**fleet_env, **FAULT_ENV}, tmp_path, redis_client)


@pytest.fixture
def faulty_slow_to_lapse(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> Iterator[Faulty]:
    """A fleet whose heartbeat timeout outlasts any process start on a loaded machine, so a
    worker started again under its name is back before the routers would call it lapsed."""
    env = {**fleet_env, **FAULT_ENV, "REINS_HEARTBEAT_TIMEOUT_S": "30"}
    yield from _faulty(env, tmp_path, redis_client)


def _faulty(env: dict[str, str], tmp_path: Path, redis_client: redis.Redis) -> Iterator[Faulty]:
    run = Faulty(env, tmp_path / "fleet", redis_client)
    try:
        yield run
    finally:
        for name, proc in run.fleet.procs.items():
            if proc.poll() is None and name.startswith("w") and "hung" in " ".join(proc.args):
                run.fleet.kill(name)  # a wedged worker cannot drain
        stop_all(run.fleet)
        run.fleet.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def through_the_hole(
    run: Faulty,
    proxy: BlackHoleProxy,
    logged: str,
    within_s: float,
    *,
    meanwhile: Callable[[], object] = lambda: None,
    routers: Callable[[Iterable[bool]], bool] = all,
) -> None:
    """Once 40 turns were admitted, black-hole ``proxy`` and do ``meanwhile`` until the
    ``routers`` (all, or any) log ``logged``, then open it again: every trajectory ends,
    nothing twice, and no process exited."""
    feed = Feed(run.client, run.prefix)
    wait_for(lambda: len(feed.admissions()) >= 40, 60, "40 admissions before the hole")
    proxy.swallow()
    meanwhile()
    wait_for(
        lambda: routers(logged in run.fleet.log(r) for r in ("r1", "r2")),
        within_s,
        f"the routers to log {logged!r} on the black hole",
    )
    proxy.restore()
    took = run.ended()
    recovered = len(run.custody.recoveries())
    print(
        f"\nafter the black hole: every trajectory ended {took:.1f}s after it closed "
        f"({recovered} turns recovered by the reconciler)"
    )
    for name, proc in run.fleet.procs.items():
        assert proc.poll() is None, f"{name} exited"


def test_a_black_holed_redis_connection_hangs_no_process(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    proxy = BlackHoleProxy("127.0.0.1", 6379)
    env = {
        **fleet_env,
        **FAULT_ENV,
        "REINS_REDIS_URL": proxy.url(TEST_DB),
        "REINS_BROKER_URL": proxy.url(TEST_DB),
        "REINS_REDIS_TIMEOUT_S": "1.5",
        "REINS_REDIS_CONNECT_TIMEOUT_S": "1",
    }
    run = Faulty(env, tmp_path / "fleet", redis_client)
    try:
        start(run.fleet, backend=UNDEDUPLICATED, routers=("r1", "r2"))
        run.submit(120, 2000)
        # every connection of every process: accepted, never answered
        through_the_hole(run, proxy, "Timeout", 30)
    finally:
        stop_all(run.fleet)
        run.fleet.close()
        proxy.close()


@pytest.mark.amqp
def test_a_black_holed_rabbitmq_exits_no_router_and_loses_no_turn(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    require_rabbitmq()
    port = int(AMQP_URL.split("@", 1)[1].split("/", 1)[0].split(":")[1])
    proxy = BlackHoleProxy("127.0.0.1", port)
    env = {
        **fleet_env,
        **FAULT_ENV,
        "REINS_BROKER_URL": AMQP_URL,
        "REINS_REDIS_TIMEOUT_S": "1.5",
        "REINS_REDIS_CONNECT_TIMEOUT_S": "1",
    }
    # The routers publish through the proxy; the workers consume from RabbitMQ directly.
    via_proxy = {"REINS_BROKER_URL": AMQP_URL.replace(f":{port}/", f":{proxy.port}/")}
    run = Faulty(env, tmp_path / "fleet", redis_client)
    try:
        start(run.fleet, backend=UNDEDUPLICATED, routers=())
        for r in ("r1", "r2"):
            run.fleet.start("router", r, "--admitter", "redis", env=via_proxy)
        run.fleet.wait_ready(["w1", "w2"], ["r1", "r2"])
        run.submit(40, 2600)  # admitted and sent before the hole: connected
        # More jobs while nothing comes back: their first turns are admitted and cannot be
        # confirmed (most later turns are follow-on turns, which need no router).
        more = partial(run.submit, 80, 2640)
        through_the_hole(run, proxy, "did not confirm", 60, meanwhile=more, routers=any)
    finally:
        stop_all(run.fleet)
        run.fleet.close()
        proxy.close()
        delete_member_queues(env, run.fleet.procs)


def test_a_worker_killed_while_its_writes_await_their_answers_sends_none_again(
    faulty: Faulty,
) -> None:
    """The refunds and e-mails w2 had carried out and not yet heard back about are recovered:
    each is looked up and found, never sent again (the store cannot de-duplicate, and every
    order has room for a second refund)."""
    start(faulty.fleet, backend=UNDEDUPLICATED, routers=("r1",))
    answering = answering_key(faulty.prefix, faulty.fleet.procs["w2"].pid)
    faulty.submit(80, 2800)
    wait_for(
        lambda: faulty.client.hlen(answering) >= 4,
        60,
        "w2 to await the answers of 4 writes",
        every_s=0.01,
    )
    awaited = faulty.client.hlen(answering)
    faulty.fleet.kill("w2")  # the effects happened; the answers will never arrive
    took = faulty.ended()  # nothing sent twice (checked there)
    print(f"\nw2 killed awaiting {awaited} writes' answers; all ended {took:.1f}s after")


def test_a_worker_started_again_under_its_name_hands_its_turns_to_the_reconciler(
    faulty_slow_to_lapse: Faulty,
) -> None:
    faulty = faulty_slow_to_lapse  # w2 is back well within the heartbeat timeout
    start(faulty.fleet, backend=UNDEDUPLICATED, routers=("r1",))
    faulty.submit(100, 2200)
    wait_for(
        lambda: len(faulty.custody.entrusted_to("w2")) >= 15, 60, "w2 to have 15 turns in custody"
    )
    held = len(faulty.custody.entrusted_to("w2"))
    faulty.fleet.kill("w2")  # a crash; its container restarts at once under the same name
    faulty.fleet.start("worker", "w2", "--backend", UNDEDUPLICATED)
    took = faulty.ended()
    recoveries = faulty.custody.recoveries()
    # Usually the new incarnation's registration sets the old one's custody aside and the
    # reconciler recovers it from there; on a loaded machine a router may see the name
    # registered but not yet heartbeating first, and recover the same entries under "w2".
    earlier = [e for e in recoveries if e["member"].startswith("w2 (incarnation ")]
    lapsed = [e for e in recoveries if e["member"] == "w2"]
    assert earlier or lapsed, "the turns of the killed incarnation were recovered"
    print(
        f"\nw2 killed with {held} turns in custody and started again at once: {len(earlier)} "
        f"recovered from its earlier incarnation, {len(lapsed)} as a lapsed member; every "
        f"trajectory ended {took:.1f}s after the restart"
    )


def test_a_wedged_worker_whose_heartbeat_goes_on_is_treated_as_dead(faulty: Faulty) -> None:
    port = free_port()
    wedged = {"REINS_WORKER_CONCURRENCY": "2", "REINS_HEALTH_PORT": str(port)}
    faulty.fleet.start("worker", "w1", "--backend", UNDEDUPLICATED)
    faulty.fleet.start(
        "worker", "w2", "--backend", "tests.fleet.faults:hung_support_store", env=wedged
    )
    faulty.fleet.start("router", "r1", "--admitter", "redis")
    faulty.fleet.wait_ready(["w1", "w2"], ["r1"])
    faulty.submit(90, 2400)  # more than w2's threads and prefetch can take off its queue
    membership = Membership(
        faulty.client, faulty.prefix, heartbeat_timeout_s=2.0, stall_timeout_s=4.0
    )

    def w2_stalled() -> bool:
        return any(r.name == "w2" and r.stalled for r in membership.records())

    wait_for(w2_stalled, 60, "w2 to stall (its refunds hang, its heartbeat goes on)")
    (w2,) = [r for r in membership.records() if r.name == "w2"]
    assert not w2.live and time.time() - w2.heartbeat_at < 2.0, "heartbeating, yet not live"
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5)
        raise AssertionError("the wedged worker's liveness probe passed")
    except urllib.error.HTTPError as exc:
        assert exc.code == 503 and "consumer took none" in exc.read().decode()
    took = faulty.ended()
    recovered = [e for e in faulty.custody.recoveries() if e["member"] == "w2"]
    assert recovered, "its turns were recovered by the reconciler"
    print(
        f"\nw2 wedged with {w2.progress.queued} messages queued; {len(recovered)} of its turns "
        f"recovered; every trajectory ended {took:.1f}s after the stall was seen"
    )


def test_notices_lost_with_their_feed_leave_no_trajectory_behind(faulty: Faulty) -> None:
    env = {"REINS_FOLLOW_ON_TURNS": "0"}  # every turn's end goes through the feed
    start(faulty.fleet, backend=UNDEDUPLICATED, routers=("r1", "r2"), env=env)
    faulty.submit(90, 2600)
    feed = Feed(faulty.client, faulty.prefix)
    wait_for(lambda: len(feed.admissions()) >= 60, 60, "60 admissions")
    # The feed is destroyed (the notices in it lost) and pushes fail while it cannot be written.
    faulty.client.set(feed.notices_key, "not a feed")
    wait_for(
        lambda: any("could not push the notice" in faulty.fleet.log(w) for w in ("w1", "w2")),
        30,
        "a worker's notice push to fail",
    )
    faulty.client.delete(feed.notices_key)
    took = faulty.ended()
    print(f"\nthe feed was lost under load; every trajectory ended {took:.1f}s after it came back")


def test_unparseable_notices_among_good_ones_are_set_aside_and_stop_nothing(
    faulty: Faulty,
) -> None:
    env = {"REINS_FOLLOW_ON_TURNS": "0"}  # every turn's end goes through the feed
    start(faulty.fleet, backend=UNDEDUPLICATED, routers=("r1", "r2"), env=env)
    feed = Feed(faulty.client, faulty.prefix)
    poison = [b"not json", b'["ready","acme"]', b'["from-a-newer-build",1,2,3]']
    for raw in poison:  # written between good notices, as a newer build's worker would
        faulty.client.xadd(feed.notices_key, {FIELD: raw})
    faulty.submit(45, 2800)
    for raw in poison:
        faulty.client.xadd(feed.notices_key, {FIELD: raw})
    took = faulty.ended()
    dead = dead_letters(faulty.client, feed.dead_key, 100)
    assert sorted(d.raw for d in dead) == sorted(poison * 2), "each set aside, with its bytes"
    assert all(d.error for d in dead) and {d.source for d in dead} == {"notices"}
    doctor = subprocess.run(
        [str(Path(sys.executable).parent / "reins"), "doctor", "--json"],
        env={**os.environ, **faulty.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    listed = json.loads(doctor.stdout)["dead_letters"]
    assert len(listed) == len(dead), doctor.stderr
    print(f"\n{len(dead)} unparseable notices set aside; every trajectory ended in {took:.1f}s")
