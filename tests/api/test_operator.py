"""The operator's endpoints (ring, drain, remove) and usage: a tenant sees its own share, an
operator every tenant's."""

from __future__ import annotations

import pytest
import redis
from fastapi.testclient import TestClient

from kernel.record import TrajectoryRecord
from router.placement.membership import Membership
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis


def test_an_operator_drains_then_removes_a_worker_and_a_tenant_cannot(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    membership = Membership(redis_client, key_prefix)
    membership.register("w9")
    ops, tenant = keys.auth(keys.operator), keys.auth(keys.acme)
    assert http.post("/v1/fleet/workers/w9/drain", headers=tenant).status_code == 403
    early = http.post("/v1/fleet/workers/w9/remove", headers=ops)
    assert early.status_code == 409 and early.json()["field"] == "name"

    drained = http.post("/v1/fleet/workers/w9/drain", headers=ops)
    assert drained.status_code == 200 and drained.json()["draining"] is True
    ring = http.get("/v1/fleet/ring", headers=ops).json()
    assert [(m["name"], m["draining"]) for m in ring["members"]] == [("w9", True)]
    assert http.post("/v1/fleet/workers/w9/remove", headers=ops).status_code == 200
    assert membership.records() == ()
    missing = http.post("/v1/fleet/workers/w9/drain", headers=ops)
    assert missing.status_code == 404 and missing.json()["field"] == "name"


def test_usage_shows_a_tenant_its_own_share_and_an_operator_every_tenant(
    http: TestClient,
    keys: Keys,
    acme_held: TrajectoryRecord,
) -> None:
    body = {"agent": "examples.support_store:agent", "goal": "refund ord_9", "user": "u"}
    http.post("/v1/trajectories", json=body, headers=keys.auth(keys.globex))

    (mine,) = http.get("/v1/usage", headers=keys.auth(keys.acme)).json()
    assert mine["tenant"] == "acme" and mine["weight_share"] == pytest.approx(0.75)
    assert mine["admissions"] >= 1 and mine["admitted_share"] == pytest.approx(1.0)
    assert mine["wait_p99_s"] is not None and mine["backlog"] == 0
    every = http.get("/v1/usage", headers=keys.auth(keys.operator)).json()
    assert [u["tenant"] for u in every] == ["acme", "globex"]
    assert every[1]["backlog"] == 1 and every[1]["admissions"] == 0
