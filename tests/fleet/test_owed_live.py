"""What an ended run owes is settled by a running router, on its own tick, through a lookup.

A worker process carries out a refund on a store that cannot de-duplicate; the refund takes
effect and its answer never comes back. An operator kills the run meanwhile, so it ends with the
refund's outcome unknown and handed to the reconciler, and the worker is SIGKILLed. Nobody in
the test calls a sweep: the live router's tick (``Reconciler.tick``: custody, the stranded
backstop, then what ended runs owe) delivers ``Reconcile`` after ``REINS_OWED_AFTER_S``; its
lookup goes to the worker started in the dead one's place, finds the effect, and the ledger
closes. Nothing is sent twice. The stated bound: ``(kernel.owed.MAX_LOOKUPS + 2) *
owed_after_s`` after the run ended, plus the new worker's start.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.owed import MAX_LOOKUPS
from kernel.record import OpKind, OpStatus
from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import ROOMY_TOTAL, UNDEDUPLICATED, caller_api, sent_twice, stop_all
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
HUNG = "tests.fleet.faults:applied_then_hung_store"
OWED_AFTER_S = 1.0
ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_OWED_AFTER_S": str(OWED_AFTER_S),
}
BOUND_S = (MAX_LOOKUPS + 2) * OWED_AFTER_S  # from the end of the run


def test_a_running_router_settles_what_an_ended_run_owes_through_a_lookup(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, key_prefix: str
) -> None:
    env = {**fleet_env, **ENV}
    fleet = LocalFleet(env, tmp_path, redis_client)
    store = RedisStore(redis_client, prefix=key_prefix)
    state = RedisState(redis_client, key_prefix, seed=False)
    try:
        fleet.start("worker", "w1", "--backend", HUNG)
        fleet.start("router", "r1", "--admitter", "redis")
        fleet.wait_ready(["w1"], ["r1"])
        (oid,) = seed_orders(redis_client, key_prefix, 7000, 1, total=ROOMY_TOTAL)
        api = caller_api(env, redis_client, "redis", None)
        tid = api.submit("acme", refund_job(oid)).trajectory_id

        wait_for(lambda: len(state.effects()) == 1, 60, "the refund to take effect")
        api.control("acme", tid, "kill", "operator")
        wait_for(lambda: tid in store.owing("acme"), 30, "the killed run to owe the refund")
        ended = time.monotonic()
        fleet.kill("w1")  # SIGKILL: the refund's answer is never sent
        fleet.start("worker", "w2", "--backend", UNDEDUPLICATED)

        def settled() -> bool:
            rec = store.load("acme", tid)
            return rec.stop_reason is not None and tid not in store.owing("acme")

        # a deadline for the test, not a figure: the stated bound with room for a loaded machine
        wait_for(settled, BOUND_S + 30, "the router to settle what the ended run owes")
        took = time.monotonic() - ended
        print(f"\nsettled {took:.1f}s after the run ended (stated bound {BOUND_S:.0f}s)")

        rec = store.load("acme", tid)
        assert rec.stop_reason is StopReason.KILLED, rec.stop_reason
        (refund,) = [op for op in rec.operations.values() if op.tool == "issue_refund"]
        assert refund.kind is OpKind.TOOL and refund.status is OpStatus.SETTLED
        assert refund.evidence is not None and refund.evidence.get("status") == "ok", (
            "the lookup found the effect"
        )
        assert not rec.open_operations and rec.ledger.tool_calls.reserved == 0
        assert sent_twice(redis_client, key_prefix) == {}, "looked up, never sent again"
        assert state.effects() == [["refund", oid, 3000]]
    finally:
        stop_all(fleet)
        fleet.close()
