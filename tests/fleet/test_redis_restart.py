"""Redis SIGKILLed and started again under load, with turns committing at that moment.

A redis-server of the test's own (``--appendonly yes --appendfsync always``, its own loopback
port) holds the store and the broker of two routers and two Celery workers. It is SIGKILLed by
PID while refunds run, at a moment when writes that took effect await their answers (the backend
cannot de-duplicate), and started again on the same port and directory. Nobody restarts a fleet
process: none exits, every trajectory ends, no record loses a version it had committed, no write
attempt goes beyond one per key, and a cancel sent after the restart still reaches a running
model call (the workers' cancel listeners subscribed again). Turns whose commits failed while
Redis was down are counted: they left custody and were recovered (the awaited writes among them
are looked up, never sent again).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from kernel.states import TERMINAL, LifecycleState, StopReason
from ops.local.fleet import LocalFleet
from router.process.submit import RouterApi
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.faults import answering_key
from tests.fleet.harness import refund_job, seed_orders, submit_refunds
from tests.fleet.processes import (
    KERNEL_ALONE,
    ROOMY_TOTAL,
    STORE_FAULT_ENV,
    UNDEDUPLICATED,
    caller_api,
    sent_twice,
    start,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for
from tests.support.redis_server import OwnRedis

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 120
CANCEL_TRIES = 5
WORKERS = ("w1", "w2")


def cancel_a_model_call(
    api: RouterApi,
    store: RedisStore,
    fleet: LocalFleet,
    client: redis.Redis,
    prefix: str,
    order: int,
) -> tuple[str, str]:
    """Submit one refund, cancel it once its model call is admitted, and say what the workers
    made of it: ``canceled`` (the running call was stopped) or ``overtaken`` (the cancel was
    committed before a worker started the turn, which then ended the run without the call)."""
    oid = seed_orders(client, prefix, order, 1)[0]
    tid = api.submit("acme", refund_job(oid)).trajectory_id

    def calling() -> bool:
        return store.load("acme", tid).state is LifecycleState.CALLING_MODEL

    wait_for(calling, 30, "the new trajectory's model call to be admitted", every_s=0.01)
    call_id = f"{tid}/m{store.load('acme', tid).turn}"
    api.control("acme", tid, "cancel", "operator")
    outcomes = {
        "canceled": f"canceled model call {call_id}",
        "overtaken": f"turn of {tid}: canceled before it started",
    }
    found: list[str] = []

    def told() -> bool:
        logs = "".join(fleet.log(w) for w in WORKERS)
        found[:] = [name for name, line in outcomes.items() if line in logs]
        return bool(found)

    wait_for(told, 30, "a worker to cancel the running call or refuse the overtaken turn")
    return tid, found[0]


def test_a_redis_restart_under_load_ends_no_process_and_loses_nothing(
    fleet_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "redis").mkdir()
    server = OwnRedis(tmp_path / "redis")
    server.start()
    client = redis.Redis.from_url(server.url)
    env = {
        **fleet_env,
        "REINS_REDIS_URL": server.url,
        "REINS_BROKER_URL": server.url,
        **STORE_FAULT_ENV,
        **KERNEL_ALONE,
    }
    prefix = env["REINS_KEY_PREFIX"]
    (tmp_path / "fleet").mkdir()
    fleet = LocalFleet(env, tmp_path / "fleet", client)
    store = RedisStore(client, prefix=prefix)
    try:
        start(fleet, routers=("r1", "r2"), backend=UNDEDUPLICATED)
        api = caller_api(env, client, "redis", None)
        orders = seed_orders(client, prefix, 3000, TRAJECTORIES, total=ROOMY_TOTAL)
        ids = submit_refunds(api, orders, list(WEIGHTS))
        feed = Feed(client, prefix)
        wait_for(lambda: len(feed.admissions()) >= 80, 60, "80 admissions before the restart")
        answering = [answering_key(prefix, fleet.procs[w].pid) for w in WORKERS]
        wait_for(
            lambda: sum(client.hlen(key) for key in answering) >= 2,
            60,
            "2 writes that took effect to await their answers",
            every_s=0.01,
        )
        versions = {tid: store.load(t, tid).record_version for t, tid in ids}
        logged = {n: len(fleet.log(n)) for n in fleet.procs}
        server.kill()  # turns are committing right now
        down_at = time.monotonic()

        def noticed() -> bool:
            """Redis stays away until every process ran into it and a turn's commit failed
            past its retries."""
            fresh = {n: fleet.log(n)[logged[n] :] for n in fleet.procs}
            return all("Error" in text for text in fresh.values()) and any(
                "failed on" in fresh[w] for w in ("w1", "w2")
            )

        wait_for(noticed, 30, "every process to notice Redis is gone, and a turn to fail")
        server.start()
        print(f"\nRedis was down {time.monotonic() - down_at:.2f}s (SIGKILL, AOF reload)")

        began = time.monotonic()
        wait_all_ended(store, ids, 240, fleet)  # raises if any fleet process exited
        print(f"every trajectory ended {time.monotonic() - began:.1f}s after the restart")
        records = {tid: store.load(t, tid) for t, tid in ids}
        assert all(r.state in TERMINAL for r in records.values())
        lost = {tid for tid, v in versions.items() if records[tid].record_version < v}
        assert lost == set(), f"records lost committed versions: {sorted(lost)[:10]}"
        twice = sent_twice(client, prefix)
        assert twice == {}, f"a write was sent twice: {twice}"
        failed = sum(fleet.log(w).count("failed on") for w in ("w1", "w2"))
        assert failed > 0
        print(f"{failed} turns failed while Redis was away; each left custody and was recovered")

        # A cancel committed between the admission and the worker's start of the turn makes
        # the worker end the run without sending the call: it says nothing of the listener,
        # so the test tries a new trajectory (at most CANCEL_TRIES).
        reached = None
        for attempt in range(CANCEL_TRIES):
            tid, outcome = cancel_a_model_call(api, store, fleet, client, prefix, 3900 + attempt)
            wait_all_ended(store, [("acme", tid)], 30, fleet)
            assert store.load("acme", tid).stop_reason is StopReason.CANCELED
            if outcome == "canceled":
                reached = tid
                break
        assert reached is not None, f"no cancel reached a running call in {CANCEL_TRIES} tries"
        print(f"a cancel after the restart stopped a running model call (try {attempt + 1})")
        for name, proc in fleet.procs.items():
            assert proc.poll() is None, f"{name} exited"
    finally:
        stop_all(fleet)
        fleet.close()
        server.stop()
