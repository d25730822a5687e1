"""Memory on the fleet, end to end: real Redis, two Celery worker processes, a router process.

The remembering support-store agent is told in one run that a customer wants replies in
Arabic; it notes that as the customer's fact (``remember_fact``, carried out by whichever
worker takes the turn, the owner taken from the trajectory). The customer's next run, whose
goal says nothing of it, recalls it and sends the confirmation in Arabic; another customer's
run of the same tenant and agent recalls nothing and writes in English. Each ended run leaves
an episode under its customer, and the customer's next run is submitted with the earlier
run's episode in its first view.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.memory import MemoryKind, Scope
from kernel.render import render
from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from store.memory_redis import RedisMemory
from store.redis_store import RedisStore
from tests.fleet.harness import seed_orders
from tests.fleet.processes import caller_api, start, wait_all_ended

pytestmark = [pytest.mark.redis]
AGENT = "examples.support_store.remembering:agent"


def test_a_customers_preference_noted_in_one_run_is_used_in_the_next(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    gates_file: Path,
) -> None:
    start(local_fleet, gates=gates_file, routers=("r1",))
    api = caller_api(fleet_env, redis_client, "redis", gates_file)
    first, second = seed_orders(redis_client, key_prefix, 5000, 2)
    bob = {"customer": "cu_bob", "total": 4200, "refunded": 0, "status": "delivered"}
    redis_client.set(f"{key_prefix}:store:order:ord_7000", json.dumps(bob))
    store = RedisStore(redis_client, prefix=key_prefix)

    def run(order: str, user: str, said: str = "") -> str:
        goal = f"refund the damaged item on order {order}{said}"
        tid = api.submit("acme", {"agent": AGENT, "goal": goal, "user": user}).trajectory_id
        wait_all_ended(store, [("acme", tid)], 90, local_fleet)
        return tid

    ids = [run(first, "cu_ana", "; the customer prefers replies in ar")]
    ids += [run(second, "cu_ana"), run("ord_7000", "cu_bob")]

    records = [store.load("acme", tid) for tid in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * 3, [
        (r.stop_reason, r.closing_message) for r in records
    ]
    emails = {
        e[1]: e[2:]
        for e in RedisState(redis_client, key_prefix, seed=False).effects()
        if e[0] == "email"
    }
    assert emails == {first: ["ar"], second: ["ar"], "ord_7000": ["en"]}
    memory = RedisMemory(redis_client, prefix=key_prefix)
    [fact] = memory.items("acme", MemoryKind.FACT)
    assert (fact.scope, fact.subject, fact.value) == (Scope.USER, "cu_ana", {"text": "ar"})
    episodes = memory.items("acme", MemoryKind.EPISODE)
    # the customer's next run was submitted with her earlier run in its first view; bob's not
    [earlier] = records[1].episodes or []
    assert (earlier["goal"], earlier["outcome"]) == (records[0].goal, "done")
    assert records[0].goal in render(records[1])  # the model is shown it
    assert records[2].episodes is None
    assert sorted((e.subject, e.key, e.value["outcome"]) for e in episodes) == sorted(
        [("cu_ana", ids[0], "done"), ("cu_ana", ids[1], "done"), ("cu_bob", ids[2], "done")]
    )
