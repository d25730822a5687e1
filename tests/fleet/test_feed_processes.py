"""The durable feed on real processes: a router that dies between taking notices and requeueing
them, or whose requeue fails, loses none of them.

Real Redis, Celery workers w1 and w2 on the support store's shared backend, routers as ``reins
router`` processes on the shared admitter. Follow-on turns are off, so every turn that ends READY
goes back through a router by its notice: a lost READY notice would leave its trajectory READY with
no queue entry for ever, and the test would time out. The faults are the router's test-only hook
(:mod:`tests.fleet.router_faults`). The second run also SIGKILLs worker w2 while it awaits the
answers of writes that took effect (the backend cannot de-duplicate and answers writes slowly), so
a recovered write sent again without a look-up would show. Each run ends with every trajectory
terminal and no write attempt beyond one per key, and prints the time to recovery (a figure, not
asserted).
"""

from __future__ import annotations

import re
import signal
import time
from datetime import datetime

import pytest
import redis

from examples.support_store.state import RedisState
from ops.local.fleet import LocalFleet
from router.wire.feed import Feed
from router.wire.notices import Notice, NoticeKind
from router.wire.streams import FIELD, pending_counts, pending_entries
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.faults import answering_key
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    KERNEL_ALONE,
    ROOMY_TOTAL,
    UNDEDUPLICATED,
    caller_api,
    sent_twice,
    stop_all,
    wait_all_ended,
)
from tests.fleet.router_faults import DIE_AFTER_READY_TAKES, FAULT_VAR, REQUEUE_RAISES
from tests.fleet.router_faults import MODULE as faults_module
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 30
EVERY_TURN_BY_NOTICE = {"REINS_FOLLOW_ON_TURNS": "0", **KERNEL_ALONE}


def boot(
    fleet: LocalFleet, faulty: str, fault: str, routers: tuple[str, ...] = ("r1", "r2")
) -> None:
    """Workers w1 and w2, then the routers; ``faulty`` with ``fault`` installed."""
    for w in ("w1", "w2"):
        fleet.start("worker", w, "--backend", UNDEDUPLICATED, env=EVERY_TURN_BY_NOTICE)
    for r in routers:
        if r == faulty:
            env = {**EVERY_TURN_BY_NOTICE, FAULT_VAR: fault}
            fleet.start("router", r, "--admitter", "redis", env=env, module=faults_module)
        else:
            fleet.start("router", r, "--admitter", "redis", env=EVERY_TURN_BY_NOTICE)
    fleet.wait_ready(["w1", "w2"], list(routers))


def submit(fleet_env: dict[str, str], client: redis.Redis, prefix: str) -> list[tuple[str, str]]:
    api = caller_api(fleet_env, client, "redis", None)
    orders = seed_orders(client, prefix, 1000, TRAJECTORIES, total=ROOMY_TOTAL)
    return submit_refunds(api, orders, list(WEIGHTS))


def check_effects(client: redis.Redis, prefix: str) -> None:
    assert RedisState(client, prefix, seed=False).effects(), "the refunds ran"
    twice = sent_twice(client, prefix)
    assert twice == {}, f"a write was sent twice: {twice}"


def logged_at(log: str, marker: str) -> datetime:
    """When the first line of ``log`` holding ``marker`` was written (its asctime)."""
    for line in log.splitlines():
        if marker in line:
            stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ", line)
            assert stamp, line
            return datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
    raise AssertionError(f"no line with {marker!r} in:\n{log[-3000:]}")


def test_a_router_killed_between_take_and_requeue_is_taken_over_by_another(
    local_fleet: LocalFleet, fleet_env: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    feed = Feed(redis_client, key_prefix)
    store = RedisStore(redis_client, prefix=key_prefix)
    boot(local_fleet, "r1", f"{DIE_AFTER_READY_TAKES}:3")
    ids = submit(fleet_env, redis_client, key_prefix)

    code = local_fleet.wait_exit("r1", 90)  # it SIGKILLs itself after its third READY take
    died = time.monotonic()
    assert code == -signal.SIGKILL, local_fleet.log("r1")[-3000:]
    left = pending_entries(redis_client, feed.notices_key, 1000, "r1")
    assert left, "r1 died holding notices it had taken and not acknowledged"
    kinds = set()
    for entry in left:
        for _, fields in redis_client.xrange(feed.notices_key, entry.id, entry.id):
            kinds.add(Notice.decode(fields[FIELD]).kind)
    assert NoticeKind.READY in kinds, "among them READY ones: lost, their runs would stall"
    print(f"\nr1 SIGKILLed holding {len(left)} notices ({sorted(k.value for k in kinds)})")

    def taken_over() -> bool:
        local_fleet._check_alive()
        return "r1" not in pending_counts(redis_client, feed.notices_key)

    wait_for(taken_over, 30, "r2 to take over r1's pending notices", every_s=0.05)
    print(
        f"r2 took them over {time.monotonic() - died:.2f}s after r1 died "
        f"(REINS_HEARTBEAT_TIMEOUT_S {fleet_env['REINS_HEARTBEAT_TIMEOUT_S']}s)"
    )
    assert "r2 took over" in local_fleet.log("r2")

    wait_all_ended(store, ids, 120, local_fleet)
    print(f"every trajectory ended {time.monotonic() - died:.2f}s after r1 died")
    check_effects(redis_client, key_prefix)
    codes = stop_all(local_fleet)
    assert all(code == 0 for code in codes.values()), codes
    assert pending_counts(redis_client, feed.notices_key) == {}, "nothing left pending"


def test_a_requeue_that_fails_after_a_take_is_retried_from_the_pending_notices(
    local_fleet: LocalFleet, fleet_env: dict[str, str], redis_client: redis.Redis, key_prefix: str
) -> None:
    feed = Feed(redis_client, key_prefix)
    store = RedisStore(redis_client, prefix=key_prefix)
    boot(local_fleet, "r1", f"{REQUEUE_RAISES}:1", routers=("r1",))
    answering = answering_key(key_prefix, local_fleet.procs["w2"].pid)
    ids = submit(fleet_env, redis_client, key_prefix)

    wait_for(
        lambda: redis_client.hlen(answering) >= 2,
        90,
        "w2 to await the answers of 2 writes",
        every_s=0.01,
    )
    awaited = redis_client.hlen(answering)
    local_fleet.kill("w2")  # the effects happened; their answers will never arrive
    redis_client.delete(answering)
    wait_for(lambda: "fault fired" in local_fleet.log("r1"), 90, "the injected requeue failure")
    wait_all_ended(store, ids, 120, local_fleet)
    log = local_fleet.log("r1")
    assert "cycle of r1 failed: TEST ONLY: injected requeue failure" in log
    failed = logged_at(log, "fault fired")
    # Its next cycle reads its own pending notices first (not a reclaim after the timeout).
    retaken = logged_at(log, "back from its pending entries")
    print(
        f"\nr1's requeue failed at {failed:%H:%M:%S.%f}; its next cycle took the notices back "
        f"{(retaken - failed).total_seconds():.3f}s later; w2 was killed awaiting {awaited} "
        "writes' answers"
    )
    check_effects(redis_client, key_prefix)
    codes = stop_all(local_fleet)
    assert all(code == 0 for code in codes.values()), codes
    assert pending_counts(redis_client, feed.notices_key) == {}, "nothing left pending"
