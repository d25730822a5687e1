"""Erasure that erases, with every memory setting at its default but ``episodes=True``.

Two customers of one tenant run the note-keeping support agent (``examples.support_store.notes``):
each run notes the customer's name and e-mail as a *tenant-wide* fact and leaves an episode. On
the fleet (a router and a worker in process, memory in Redis) the erasure goes through the API;
on the embedded runner (memory in SQLite) through the store. Afterwards no fact, episode or
index entry of the erased customer remains, scanning the raw store (every memory key under the
test's prefix and everything in it; every row of every table), the other customer's items are
all still there, and no recall by anyone returns the erased customer's data.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from examples.support_store.notes import NotesBackend, agent
from examples.support_store.state import SEED_ORDERS, MemoryState, Order
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, ms
from kernel.record import TrajectoryRecord
from kernel.states import StopReason
from router.fleet.episodes import write_episode
from store.memory_base import MemoryBank
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory
from tests.api.conftest import Keys
from tests.fleet.conftest import tenants_toml
from tests.fleet.harness import InProcessFleet, seed_orders
from tests.support.raw_memory import mentions
from worker.embedded import EmbeddedRunner
from worker.memory_tools import MemoryBackend
from worker.models import ScriptedModel

pytestmark = pytest.mark.redis
AGENT = "examples.support_store.notes:agent"
NOW_MS = 1_800_000_000_000  # the embedded runs' clock
ANA = {"user": "cu_ana", "name": "Ana Ruiz", "email": "ana@example.com"}
BOB = {"user": "cu_bob", "name": "Bob Stone", "email": "bob@example.com"}


def goal(who: dict[str, str], order: str) -> str:
    return f"refund the damaged item on order {order} for {who['name']}, {who['email']}"


def held_about(bank: MemoryBank, who: dict[str, str]) -> list[MemoryItem]:
    """Every item of the tenant that names ``who`` in its value or its concerns (a scan of
    every item, not the index an erasure uses)."""
    return [
        i
        for i in bank.items("acme")
        if any(w in json.dumps(i.value) + " ".join(i.concerns) for w in who.values())
    ]


def recalled_by_anyone(bank: MemoryBank, who: dict[str, str], now_ms: int) -> list[str]:
    """What any user of the tenant (these two, and a third) recalls at ``now_ms`` that names
    ``who``: every kind, for every tag the runs used."""
    tags = ["contact", "refund", "damaged", "item", "order", "ord_5000", "ord_7000"]
    found = []
    for user in ("cu_ana", "cu_bob", "cu_eve"):
        caller = Visibility("acme", user, AGENT)
        for kind in MemoryKind:
            for item in bank.recall(caller, kind, tags, now_ms, 100):
                text = json.dumps(item.value)
                found += [f"{user}: {text}" for w in who.values() if w in text]
    return found


def test_on_the_fleet_an_erasure_through_the_api_leaves_nothing_of_the_customer(
    redis_client: redis.Redis, key_prefix: str, tmp_path: Path, http: TestClient, keys: Keys
) -> None:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(tenants_toml())
    memory = RedisMemory(redis_client, prefix=key_prefix)
    fleet = InProcessFleet(redis_client, key_prefix, tenants, backend=NotesBackend, memory=memory)
    [ana_order] = seed_orders(redis_client, key_prefix, 5000, 1)
    bob_order = "ord_7000"
    bob = {"customer": "cu_bob", "total": 4200, "refunded": 0, "status": "delivered"}
    redis_client.set(f"{key_prefix}:store:order:{bob_order}", json.dumps(bob))
    runs = {
        who["user"]: fleet.api.submit(
            "acme", {"agent": AGENT, "goal": goal(who, order), "user": who["user"]}
        )
        for who, order in ((ANA, ana_order), (BOB, bob_order))
    }
    fleet.run_until_quiet()
    for sub in runs.values():
        assert fleet.load("acme", sub.trajectory_id).stop_reason is StopReason.DONE
    # Before: each customer has a tenant-wide contact fact and an episode under their own name;
    # the tenant-wide fact about Ana is what Bob's runs could recall.
    ana_items = held_about(memory, ANA)
    assert sorted((i.kind.value, i.scope.value) for i in ana_items) == [
        ("episode", "user"),
        ("fact", "tenant"),
    ]
    before = recalled_by_anyone(memory, ANA, ms(time.time()))
    assert any(r.startswith("cu_bob: ") and "ana@example.com" in r for r in before), before
    bob_before = sorted(i.item_id for i in held_about(memory, BOB))
    assert len(bob_before) == 2

    erased = http.delete("/v1/memory/users/cu_ana", headers=keys.auth(keys.acme)).json()
    assert sorted(i["item_id"] for i in erased["items"]) == sorted(i.item_id for i in ana_items)

    assert held_about(memory, ANA) == []
    assert recalled_by_anyone(memory, ANA, ms(time.time())) == []
    needles = [*ANA.values(), runs["cu_ana"].trajectory_id, *(i.item_id for i in ana_items)]
    assert mentions(memory, needles, prefix=f"{key_prefix}:mem:") == []
    assert sorted(i.item_id for i in held_about(memory, BOB)) == bob_before
    assert recalled_by_anyone(
        memory, BOB, ms(time.time())
    )  # Bob's own data is still there, and recalled


ORDERS: dict[str, Order] = {
    **SEED_ORDERS,
    "ord_7000": {"customer": "cu_bob", "total": 4200, "refunded": 0, "status": "delivered"},
}


def embedded_run(bank: SqliteMemory, who: dict[str, str], order: str, tid: str) -> None:
    backend = NotesBackend(MemoryState(ORDERS))
    tools = MemoryBackend(
        backend, bank, "acme", AGENT, lambda: NOW_MS / 1000, profile=agent.profile
    )
    runner = EmbeddedRunner(
        KernelContext(agent.profile),
        ScriptedModel(agent.make_policy(goal(who, order))),
        tools,
        bind=tools.bound,
    )
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="acme",
        user=who["user"],
        goal=goal(who, order),
        agent=AGENT,
        budget=Budget(),
        now=0.0,
    )
    out = runner.run(rec).record
    assert out.stop_reason is StopReason.DONE, out.closing_message
    assert write_episode(bank, out, agent.profile, NOW_MS / 1000)


def test_on_the_embedded_store_an_erasure_leaves_no_row_of_the_customer(tmp_path: Path) -> None:
    bank = SqliteMemory(tmp_path / "memory.db")
    embedded_run(bank, ANA, "ord_1001", "t-ana")
    embedded_run(bank, BOB, "ord_7000", "t-bob")
    ana_items = held_about(bank, ANA)
    assert {(i.kind, i.scope) for i in ana_items} == {
        (MemoryKind.EPISODE, Scope.USER),
        (MemoryKind.FACT, Scope.TENANT),
    }
    before = recalled_by_anyone(bank, ANA, NOW_MS)
    assert any(r.startswith("cu_bob: ") and "ana@example.com" in r for r in before), before
    bob_before = sorted(i.item_id for i in held_about(bank, BOB))
    erased = bank.erase_user("acme", "cu_ana")
    assert sorted(i.item_id for i in erased) == sorted(i.item_id for i in ana_items)
    assert held_about(bank, ANA) == []
    assert recalled_by_anyone(bank, ANA, NOW_MS) == []
    needles = [*ANA.values(), "t-ana", *(i.item_id for i in ana_items)]
    assert mentions(bank, needles) == []
    assert sorted(i.item_id for i in held_about(bank, BOB)) == bob_before
    assert recalled_by_anyone(bank, BOB, NOW_MS)
