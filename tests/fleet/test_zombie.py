"""A zombie worker: paused with its writes in flight, recovered elsewhere, then resumed.

Real Redis, one router, two Celery worker processes, an agent whose writes declare ``lookup``,
and the support store made as a service that cannot de-duplicate, behind a backend that keeps
each write in flight for a while in the worker thread (``tests.fleet.paced_backend``). Once
``w2`` has at least 20 writes in flight it is SIGSTOPped by PID: its heartbeat lapses, the
router's reconciler recovers every turn in its custody, ``w1`` looks each key up (the store
remembers the lookup's fence; the answer is "absent", since the paused writes never arrived)
and re-sends it under a newer fence. Then ``w2`` is SIGCONTed and its old writes arrive, late.
The store refuses them for their older fence; no order is refunded twice, though the store
would apply a repeated key again; every trajectory ends, done. The time from the pause until
the router took every turn in w2's custody and the number of refused late writes are printed
(figures, not asserted).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.states import TERMINAL
from ops.local.fleet import LocalFleet
from router.wire.custody import Custody
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.paced_backend import in_flight_key, looked_up_key
from tests.fleet.processes import (
    caller_api,
    effects_by_order,
    order_of,
    over_allowance,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 100
IN_FLIGHT_AT_PAUSE = 20
ORDER_TOTAL = 10_000  # room for two 3,000-cent refunds: the store would not stop a second one
BACKEND = "tests.fleet.paced_backend:paced_support_store"
ZOMBIE_ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",  # past the end of the test: no broker redelivery
    "REINS_SCRIPTED_LATENCY_S": "0.2",
    "REINS_WORKER_CONCURRENCY": "48",
}


def test_a_paused_workers_late_writes_are_refused_by_their_fence(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, key_prefix: str
) -> None:
    env = {**fleet_env, **ZOMBIE_ENV}
    fleet = LocalFleet(env, tmp_path, redis_client)
    store = RedisStore(redis_client, prefix=key_prefix)
    custody = Custody(redis_client, key_prefix)
    state = RedisState(redis_client, key_prefix, seed=False)
    paused = False
    try:
        for w in ("w1", "w2"):
            fleet.start("worker", w, "--backend", BACKEND)
        fleet.start("router", "r1", "--admitter", "redis")
        fleet.wait_ready(["w1", "w2"], ["r1"])
        w2 = fleet.procs["w2"]
        in_flight = in_flight_key(key_prefix, w2.pid)
        orders = seed_orders(redis_client, key_prefix, 3000, TRAJECTORIES, total=ORDER_TOTAL)
        api = caller_api(env, redis_client, "redis", None)
        ids = submit_refunds(api, orders, list(WEIGHTS))

        wait_for(
            lambda: redis_client.hlen(in_flight) >= IN_FLIGHT_AT_PAUSE,
            60,
            f"w2 to have {IN_FLIGHT_AT_PAUSE} writes in flight",
            every_s=0.02,
        )
        os.kill(w2.pid, signal.SIGSTOP)  # a GC pause, a partition: alive, silent, not dead
        paused, paused_at = True, time.monotonic()
        late = {k.decode(): int(f) for k, f in redis_client.hgetall(in_flight).items()}
        held = len(custody.entrusted_to("w2"))
        print(
            f"\nw2 SIGSTOPped with {len(late)} writes in flight, holding {held} turns "
            f"(fences {min(late.values())}..{max(late.values())})"
        )

        wait_for(
            lambda: not custody.entrusted_to("w2"),
            60,
            "the router to take every turn in w2's custody",
            every_s=0.05,
        )
        to_recovery = time.monotonic() - paused_at

        def looked_up() -> bool:  # the lookups were answered; the re-sends are still in flight
            looked = redis_client.hgetall(looked_up_key(key_prefix))
            return all(int(looked.get(key.encode(), 0)) > fence for key, fence in late.items())

        wait_for(
            looked_up,
            60,
            "w1 to look up every key w2 has in flight, under a newer fence",
            every_s=0.02,
        )
        refused_before = state.fenced_writes()
        os.kill(w2.pid, signal.SIGCONT)
        paused = False

        wait_for(lambda: redis_client.hlen(in_flight) == 0, 30, "w2's late writes to arrive")
        refused = state.fenced_writes() - refused_before
        beats = [e["since_heartbeat_s"] or 0.0 for e in custody.recoveries() if e["member"] == "w2"]
        print(
            f"every turn w2 held taken and recovered {to_recovery:.2f}s after the pause (worst "
            f"{max(beats, default=0.0):.2f}s after its last heartbeat; heartbeat timeout 2s); "
            f"{refused} late writes of w2 refused by their fence ({len(late)} in flight when "
            "it was paused)"
        )
        twice = {o: c for o, c in effects_by_order(state.effects()).items() if max(c.values()) > 1}
        assert twice == {}, "a late write took effect a second time"
        assert refused > 0, "the late writes were refused"

        wait_all_ended(store, ids, 90, fleet)
        records = [store.load(t, i) for t, i in ids]
        assert all(r.state in TERMINAL for r in records)
        stops = Counter(r.stop_reason.value for r in records if r.stop_reason)
        assert stops == Counter(done=TRAJECTORIES), stops
        effects = effects_by_order(state.effects())
        for r in records:
            assert effects[order_of(r)] == Counter(refund=1, email=1), r.trajectory_id
        assert [r.trajectory_id for r in records if over_allowance(r)] == []
        codes = stop_all(fleet)
        assert all(code == 0 for code in codes.values()), codes
    finally:
        if paused:
            os.kill(fleet.procs["w2"].pid, signal.SIGCONT)  # so that close() can end it
        fleet.close()
