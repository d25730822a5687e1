"""A router's tick retires the finished trajectories past their retention: the tenant's own
(from the fleet's document) or REINS_RETENTION_DAYS for a tenant that sets none."""

from __future__ import annotations

import time

import pytest
import redis

from kernel.settings import Settings
from router.fleet import config as fleet_config
from router.process.retention import DAY_S
from router.process.service import AdmitterKind, RouterOptions, RouterService
from tests.conftest import REDIS_URL
from tests.contract.test_retention_contract import finish

pytestmark = pytest.mark.redis
AGENTS = ["examples.support_store:agent"]


def test_the_tick_retires_by_each_tenants_retention(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    tenants = [
        {"name": n, "weight": 1, "max_ready": 9, "largest_call_tokens": 9, "agents": AGENTS}
        for n in ("acme", "globex")
    ]
    tenants[0]["retention_days"] = 30  # globex: REINS_RETENTION_DAYS
    doc = {"quantum_tokens": 10, "credit_cap_tokens": 10, "tenants": tenants}
    fleet_config.apply(redis_client, key_prefix, doc)
    env = {"REINS_KEY_PREFIX": key_prefix, "REINS_REDIS_URL": REDIS_URL}
    settings = Settings.from_env({**env, "REINS_RETENTION_DAYS": "2"})
    options = RouterOptions(name="r-ret", tenants_file="", admitter=AdmitterKind.REDIS)
    router = RouterService(settings, options, client=redis_client)
    now = time.time()
    for tenant in ("acme", "globex"):
        for days in (40, 3, 1):
            finish(router.store, f"ended-{days}d", at=now - days * DAY_S, tenant=tenant)
    router.tick()
    assert router.store.list("acme") == ["ended-1d", "ended-3d"], "acme keeps 30 days"
    assert router.store.list("globex") == ["ended-1d"], "globex keeps the default, 2 days"
    assert router.retention.retired == 3
    router.close()
