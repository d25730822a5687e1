"""Expiry deletes: the routers' memory sweep deletes facts and episodes past their own expiry or
their tenant's retention (set in the fleet's document), a bounded amount per pass, and a
router's tick runs it (the raw store is checked in the contract suite, on SQLite and Redis)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from kernel.errors import ConfigError
from kernel.memory import MemoryItem, MemoryKind, Scope, ms
from router.fleet import config as fleet_config
from router.fleet.config import ConfigSource
from router.fleet.memory_config import DAY_MS
from router.process.memory_sweep import MemorySweep, memory_keep_ms
from store.memory_base import DictMemory
from store.memory_redis import RedisMemory
from tests.fleet.conftest import tenants_toml
from tests.fleet.documents import fleet_document
from tests.fleet.harness import InProcessFleet
from tests.support.clock import ManualClock
from tests.support.raw_memory import mentions

NOW_S = 1_800_000_000.0


def item(tenant: str, key: str, written_ms: int, expires_ms: int | None = None) -> MemoryItem:
    return MemoryItem(
        kind=MemoryKind.EPISODE if expires_ms is None else MemoryKind.FACT,
        tenant=tenant,
        scope=Scope.USER,
        subject="cu_ana",
        key=key,
        value={"text": key},
        tags=["t"],
        written_ms=written_ms,
        expires_ms=expires_ms,
        concerns=["cu_ana"],
    )


def test_a_pass_deletes_at_most_its_budget_and_every_tenant_is_reached() -> None:
    bank, clock, now = DictMemory(), ManualClock(NOW_S), ms(NOW_S)
    for tenant in ("acme", "globex"):
        for n in range(6):
            bank.put(item(tenant, f"expired{n}", now - 100, expires_ms=now - 1))
        bank.put(item(tenant, "live", now - 100, expires_ms=now + DAY_MS))
        bank.put(item(tenant, "old", now - 31 * DAY_MS))  # an episode past retention
        bank.put(item(tenant, "young", now - 29 * DAY_MS))
    sweep = MemorySweep(
        bank, lambda: ("acme", "globex"), lambda t: 30 * DAY_MS, clock, every_s=10, budget=5
    )
    assert sweep.sweep() == 5
    assert sweep.sweep() == 0  # not due again until every_s has passed
    passes = 1
    while sweep.deleted < 14:
        clock.advance(10)
        assert sweep.sweep() <= 5
        passes += 1
    assert passes == 3  # 14 due items, 5 a pass: a backlog drains at the budget's pace
    for tenant in ("acme", "globex"):
        assert sorted(i.key for i in bank.items(tenant)) == ["live", "young"]
    clock.advance(10)
    assert sweep.sweep() == 0


@pytest.mark.redis
def test_a_tenants_memory_retention_is_read_from_the_fleet_document(
    redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    doc = tmp_path / "fleet.toml"
    listed = fleet_document({"acme": 1, "globex": 1})
    doc.write_text(
        listed + "\n[memory]\nretention_days = 90\n[memory.tenants.acme]\nretention_days = 7\n"
    )
    fleet_config.apply(redis_client, key_prefix, fleet_config.read_file(doc))
    source = ConfigSource(redis_client, key_prefix, refresh_s=0)
    assert memory_keep_ms(source, 365, "acme") == 7 * DAY_MS
    assert memory_keep_ms(source, 365, "globex") == 90 * DAY_MS
    assert memory_keep_ms(None, 365, "acme") == 365 * DAY_MS  # a router run from files
    version = fleet_config.stored_version(redis_client, key_prefix)
    for bad, field in (
        ("[memory]\nretention_days = 0\n", "memory.retention_days"),
        ("[memory.tenants.nobody]\nretention_days = 5\n", "memory.tenants"),
        ("[memory]\nkeep = 5\n", "memory.keep"),
    ):
        doc.write_text(listed + "\n" + bad)
        with pytest.raises(ConfigError) as refused:
            fleet_config.apply(redis_client, key_prefix, fleet_config.read_file(doc))
        assert refused.value.field == field
    assert fleet_config.stored_version(redis_client, key_prefix) == version  # nothing applied


@pytest.mark.redis
def test_a_routers_tick_deletes_expired_memory_from_redis(
    redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    memory = RedisMemory(redis_client, prefix=key_prefix)
    now = ms(time.time())
    expired = item("acme", "expired", now - 1000, expires_ms=now - 1)
    ancient = item("acme", "ancient", now - 400 * DAY_MS)  # past the default 365 days
    live = item("acme", "live", now - 1000, expires_ms=now + DAY_MS)
    for each in (expired, ancient, live):
        memory.put(each)
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(tenants_toml())
    fleet = InProcessFleet(redis_client, key_prefix, tenants)  # its boot runs a first tick
    assert fleet.service.memory_sweep.deleted == 2
    assert [i.key for i in memory.items("acme")] == ["live"]
    gone = [expired.item_id, ancient.item_id]
    assert mentions(memory, gone, prefix=f"{key_prefix}:mem:") == []
