"""A router following the fleet's document while it runs: a version that adds a tenant is
picked up at the router's next tick; the new tenant's jobs are queued and its trajectories
swept; the router admits by the new weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from kernel.errors import UnknownTenant
from kernel.settings import Settings
from router.admission.tenants import read_document
from router.fleet import config as fleet_config
from router.process.service import AdmitterKind, RouterOptions, RouterService
from tests.conftest import REDIS_URL
from tests.fleet.documents import fleet_document
from tests.fleet.harness import refund_job, seed_orders

pytestmark = pytest.mark.redis


def apply(client: redis.Redis, prefix: str, weights: dict[str, int], tmp_path: Path) -> int:
    path = tmp_path / f"fleet-{len(weights)}.toml"
    path.write_text(fleet_document(weights))
    return fleet_config.apply(client, prefix, read_document(path, "fleet configuration"))


def test_a_tenant_added_while_the_router_runs_is_admitted_and_swept(
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    apply(redis_client, key_prefix, {"acme": 1}, tmp_path)
    env = {"REINS_KEY_PREFIX": key_prefix, "REINS_REDIS_URL": REDIS_URL}
    options = RouterOptions(name="r-live", tenants_file="", admitter=AdmitterKind.REDIS)
    router = RouterService(Settings.from_env(env), options, client=redis_client)
    assert list(router.swept) == ["acme"]
    with pytest.raises(UnknownTenant, match="'hooli' is not configured"):
        router.api().submit("hooli", refund_job("ord_1"))

    assert apply(redis_client, key_prefix, {"acme": 1, "hooli": 3}, tmp_path) == 2
    router.tick()
    assert list(router.swept) == ["acme", "hooli"] and router.live.applied.version == 2
    order = seed_orders(redis_client, key_prefix, 1000, 1)[0]
    submitted = router.api().submit("hooli", refund_job(order))
    assert router.dispatcher.admitter.is_queued(submitted.trajectory_id)
    weights = redis_client.hmget(f"{{{key_prefix}:adm}}:st", ["Q:0", "Q:1", "ver"])
    assert weights == [b"1000", b"3000", b"2"]
    # A version this build cannot read (written by a newer one): kept out, the tick goes on.
    redis_client.hset(
        fleet_config.config_key(key_prefix), mapping={"version": 3, "document": '{"tenants": 1}'}
    )
    router.tick()
    assert router.live.applied.version == 2
    assert router.dispatcher.admitter.is_queued(submitted.trajectory_id)
    router.close()
