"""Through the API, on real processes: submit a refund above the automatic limit, follow its
events, reconnect once with Last-Event-ID, approve the held refund, and see it happen once."""

from __future__ import annotations

import time
import tomllib

import pytest
import redis

from api.client import Event, ReinsClient
from examples.support_store.state import RedisState
from kernel.budget import Budget
from kernel.record import TrajectoryRecord
from ops.local.fleet import LocalFleet
from router.fleet import config as fleet_config
from router.wire.feed import Feed
from router.wire.notices import ready_notice
from store.redis_store import RedisStore
from tests.api.conftest import Keys, fleet_toml
from tests.api.held import refund_body
from tests.api.processes import start_fleet
from tests.fleet.harness import seed_orders
from tests.fleet.processes import stop_all
from tests.support import wait_for

pytestmark = pytest.mark.redis


def test_a_held_refund_approved_through_the_api_happens_once_and_its_events_arrive_once(
    fleet: LocalFleet, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    url = start_fleet(fleet)
    oid = seed_orders(redis_client, key_prefix, 8100, 1, total=12_000)[0]
    with ReinsClient(url, keys.acme) as client:
        tid = client.submit(refund_body(oid), idempotency_key="e2e")["trajectory_id"]
        wait_for(lambda: client.show(tid)["state"] == "AWAITING_APPROVAL", 60, "the hold")
        assert RedisState(redis_client, key_prefix, seed=False).effects() == []

        first: list[Event] = []
        for event in client.events(tid):  # a first connection, dropped after two events
            first.append(event)
            if len(first) == 2:
                break
        held = client.show(tid)["held_approval"]
        assert held["tool"] == "issue_refund" and held["arguments"]["amount_cents"] == 9000
        done = client.decide(
            tid, held["approval_id"], approve=True, version=held["version"], digest=held["digest"]
        )
        assert done["detail"]["reviewer"] == "reviewer"
        rest = list(client.events(tid, last_event_id=first[-1].id))  # to the stop
        final = client.show(tid)
        written = [e.id for e in client.events(tid, follow=False)]  # reins events ID
        trace = client.trace(tid)

    events = first + rest
    assert [e.id for e in events] == list(range(len(events))), "an event lost or repeated"
    assert events[-1].kind == "stop"
    chain = RedisStore(redis_client, prefix=key_prefix).read("acme", tid)
    assert [e.data for e in events] == [row.model_dump(mode="json") for row in chain]
    assert final["state"] == "COMPLETED", final
    assert written == [e.id for e in events]
    assert trace["postmortem"]["stop"] == events[-1].data["outcome"]
    assert {s["kind"] for s in trace["spans"]} >= {"task", "model", "tool"}
    refunds = [
        e for e in RedisState(redis_client, key_prefix, seed=False).effects() if e[0] == "refund"
    ]
    assert len(refunds) == 1, refunds
    codes = stop_all(fleet)
    assert all(code == 0 for code in codes.values()), codes


def _smuggle(client: redis.Redis, prefix: str, tid: str, agent: str) -> None:
    """Create and queue a READY record of ``agent`` for acme, as a writer that skipped the
    API's check would."""
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="acme",
        user="cu_ana",
        goal="refund the damaged item on order ord_1001",
        agent=agent,
        budget=Budget(),
        now=time.time(),
    )
    RedisStore(client, prefix=prefix).create(rec)
    Feed(client, prefix).push(ready_notice(rec, "", time.time(), ""))


def test_no_process_imports_an_agent_no_tenant_lists_and_workers_check_the_tenant(
    fleet: LocalFleet, redis_client: redis.Redis, key_prefix: str, applied: int
) -> None:
    # globex may run the lookup variant; acme may not
    data = tomllib.loads(fleet_toml())
    data["tenants"][1]["agents"].append("examples.support_store:agent_lookup")
    fleet_config.apply(redis_client, key_prefix, data)
    start_fleet(fleet)
    _smuggle(redis_client, key_prefix, "traj-zen", "this:agent")
    _smuggle(redis_client, key_prefix, "traj-lookup", "examples.support_store:agent_lookup")

    def refused() -> bool:
        routers = "on no tenant's list" in fleet.log("r1")
        workers = any("not allowed for tenant 'acme'" in fleet.log(w) for w in ("w1", "w2"))
        return routers and workers

    wait_for(refused, 60, "the router and a worker to refuse the records")
    store = RedisStore(redis_client, prefix=key_prefix)
    assert store.load("acme", "traj-zen").chain_length == 0
    assert store.load("acme", "traj-lookup").chain_length == 0, "a refused agent's turn ran"
    logs = "".join(fleet.log(name) for name in fleet.procs)
    assert "Beautiful is better than ugly" not in logs, "a process imported this:agent"
