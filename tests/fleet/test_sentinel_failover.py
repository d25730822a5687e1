"""The store's master fails over under load, behind three Sentinels, on real processes.

A master, its replica and three Sentinels (``redis-server --sentinel``), each a process of the
test's own on a loopback port, hold the store: a router and two Celery workers run with
``REINS_REDIS_URL=redis+sentinel://...``. The broker is the machine's RabbitMQ: the Redis broker
takes ``redis://`` URLs only (``router.wire.broker.broker_kind``), so it cannot follow a
Sentinel, and only the store is behind one. The support store the agent writes to is the
machine's ordinary Redis (the ``external_undeduplicated_store`` backend): a service that cannot
de-duplicate and survives whatever the store's failover loses, so a write reins sent twice
shows there.

While refunds run, the master is failed over: by ``SENTINEL FAILOVER`` (the old master stays up
and is turned into a replica of the new one), or by a SIGKILL (the Sentinels see it down after
1 s and promote the replica). More refunds are submitted once the replica is promoted. No
process exits, every trajectory ends, no order gets a second refund or e-mail, and the new
master holds every trajectory ended: the pinned connections of the hot path followed it.
Replication is asynchronous: commits the old master acknowledged and did not pass on are lost
with it; the test prints how many (a figure, not asserted). The workers keep their look-up
before a write on (the default, unlike the chaos test's ``KERNEL_ALONE``): it is the net for a
store that lost commits, which a failover is.
"""

from __future__ import annotations

import shutil
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from examples.support_store.state import RedisState
from kernel.states import TERMINAL, StopReason
from ops.local.cluster import free_ports
from ops.local.fleet import LocalFleet
from router.wire.feed import Feed
from store.redis_client import client_from_url
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.fleet.brokers import delete_member_queues
from tests.fleet.conftest import WEIGHTS
from tests.fleet.faults import BACKEND_URL_VAR
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    ROOMY_TOTAL,
    STORE_FAULT_ENV,
    caller_api,
    effects_by_order,
    order_of,
    sent_twice,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for
from tests.support.redis_sentinel import SentinelGroup, role

pytestmark = [pytest.mark.redis, pytest.mark.slow]
BEFORE, AFTER = 100, 40
ADMITTED_AT_FAULT = 60
WORKERS = ("w1", "w2")
EXTERNAL = "tests.fleet.faults:external_undeduplicated_store"
LOST_LINE = "the store lost acknowledged writes"
MOVED_LINE = "the Sentinels name a new master ('127.0.0.1', {port}): connections move"


def redis_errors(port: int) -> float:
    """``reins_redis_errors_total`` as the process serving ``/metrics`` on ``port`` reports."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "reins_redis_errors_total"
    )


@pytest.mark.parametrize("broker", [pytest.param("amqp", marks=pytest.mark.amqp)], indirect=True)
@pytest.mark.parametrize("fault", ["sentinel-failover", "sigkill-master"])
def test_a_master_failed_over_under_load_ends_every_trajectory_and_doubles_nothing(
    fault: str,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    group = SentinelGroup(tmp_path / "sentinel")
    env = {
        **fleet_env,
        "REINS_REDIS_URL": group.url,
        **STORE_FAULT_ENV,
    }
    prefix = env["REINS_KEY_PREFIX"]
    (tmp_path / "fleet").mkdir()
    fleet: LocalFleet | None = None
    try:
        group.start()
        client = client_from_url(group.url, connect_timeout_s=1, timeout_s=1.5)
        fleet = LocalFleet(env, tmp_path / "fleet", client)
        store = RedisStore(client, prefix=prefix)
        metrics = dict(zip(WORKERS, free_ports(len(WORKERS)), strict=True))
        for w in WORKERS:
            own = {BACKEND_URL_VAR: REDIS_URL, "REINS_METRICS_PORT": str(metrics[w])}
            fleet.start("worker", w, "--backend", EXTERNAL, env=own)
        fleet.start("router", "r1", "--admitter", "redis")
        fleet.wait_ready(list(WORKERS), ["r1"])

        api = caller_api(env, client, "redis", None)
        orders = seed_orders(redis_client, prefix, 5000, BEFORE + AFTER, total=ROOMY_TOTAL)
        ids = submit_refunds(api, orders[:BEFORE], list(WEIGHTS))
        feed = Feed(client, prefix)
        wait_for(
            lambda: len(feed.admissions()) >= ADMITTED_AT_FAULT,
            60,
            f"{ADMITTED_AT_FAULT} admissions before the failover",
        )
        versions = {tid: store.load(t, tid).record_version for t, tid in ids}
        old = group.master.port
        if fault == "sentinel-failover":
            group.fail_over()
        else:
            group.master.kill()  # turns are committing right now
        group.wait_promoted(60)
        print(f"\n{fault}: the replica on port {group.replica.port} is the master")

        ids += submit_refunds(api, orders[BEFORE:], list(WEIGHTS))
        wait_all_ended(store, ids, 180, fleet)  # raises if any fleet process exited
        if fault == "sentinel-failover":  # the Sentinels make the old master a replica
            wait_for(lambda: role(old) == "slave", 60, "the old master to become a replica")

        records = {tid: store.load(t, tid) for t, tid in ids}
        assert all(r.state in TERMINAL for r in records.values())
        lost = sorted(tid for tid, v in versions.items() if records[tid].record_version < v)
        found_lost = sum(fleet.log(n).count(LOST_LINE) for n in fleet.procs)
        print(
            f"commits lost: {len(lost)} trajectories ended below a version seen before the "
            f"failover; {found_lost} commits found lost by their writers' next commit"
        )
        stops = Counter(r.stop_reason.value for r in records.values() if r.stop_reason)
        print(f"stops: {dict(stops)}")

        twice = sent_twice(redis_client, prefix)
        assert twice == {}, f"a write was sent twice: {twice}"
        effects = effects_by_order(RedisState(redis_client, prefix, seed=False).effects())
        for r in records.values():
            if r.stop_reason is StopReason.DONE:
                assert effects[order_of(r)] == Counter(refund=1, email=1), r.trajectory_id

        # The writes landed on the new master: read it directly, not through the Sentinels.
        new = redis.Redis(port=group.replica.port)
        assert role(group.replica.port) == "master"
        assert group.named_master() == {group.replica.port}
        on_new = RedisStore(new, prefix=prefix)
        ended_there = [tid for t, tid in ids if on_new.load(t, tid).state in TERMINAL]
        assert len(ended_there) == len(ids), "every trajectory's end is on the new master"
        new.close()
        moved = MOVED_LINE.format(port=group.replica.port)
        told = {n for n in fleet.procs if moved in fleet.log(n)}
        assert told == set(fleet.procs), f"only {sorted(told)} logged their move to the new master"
        errors = {w: redis_errors(metrics[w]) for w in WORKERS}
        print(f"transient Redis errors the workers met and retried: {errors}")
        if fault == "sigkill-master":
            assert all(n > 0 for n in errors.values()), "each worker met the dead master"

        for name, proc in fleet.procs.items():
            assert proc.poll() is None, f"{name} exited"
        codes = stop_all(fleet)
        assert all(code == 0 for code in codes.values()), codes
        client.close()
    finally:
        if fleet is not None:
            fleet.close()
            delete_member_queues(env, fleet.procs)
        group.stop()
        shutil.rmtree(tmp_path / "sentinel", ignore_errors=True)
        shutil.rmtree(tmp_path / "fleet", ignore_errors=True)
