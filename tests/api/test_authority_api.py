"""Grants and freezes through the API: a trajectory's (tenant keys with the control scope) and a
tenant's in the fleet's document (operator keys); bad input changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from api.front import Front
from examples.support_store.state import RedisState
from kernel.record import HoldReason
from kernel.settings import Settings
from kernel.states import LifecycleState
from router.fleet import config as fleet_config
from router.wire.turns import TurnMessage
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, Keys
from tests.fleet.harness import InProcessFleet, seed_orders
from tests.fleet.test_freeze import Counting

pytestmark = pytest.mark.redis
S = LifecycleState


@pytest.fixture
def sent() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def api(
    api_env: dict[str, str], redis_client: redis.Redis, applied: int, sent: list[dict[str, Any]]
) -> Iterator[TestClient]:
    """The API in this process; the turns it sends are kept in ``sent`` (no broker)."""
    settings = Settings.from_env(api_env)
    front = Front.wire(settings, client=redis_client)
    front._send = lambda member, payload: sent.append(payload)  # type: ignore[method-assign]
    with TestClient(create_app(settings, front), raise_server_exceptions=False) as client:
        yield client


def test_a_frozen_trajectorys_refund_waits_and_goes_when_the_api_lifts_it(
    api: TestClient,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    fleet_file: Path,
    sent: list[dict[str, Any]],
) -> None:
    auth = keys.auth(keys.acme)
    oid = seed_orders(redis_client, key_prefix, 7200, 1, total=12_000)[0]
    body = {"agent": AGENT, "goal": f"refund the damaged item on order {oid}", "user": "cu_ana"}
    tid = api.post("/v1/trajectories", json=body, headers=auth).json()["trajectory_id"]
    frozen = api.post(f"/v1/trajectories/{tid}/freeze", headers=auth)
    assert frozen.status_code == 200, frozen.text
    assert frozen.json()["detail"]["grants"]["frozen"] is True

    backends: list[Counting] = []

    def backend(state: RedisState) -> Counting:
        backends.append(Counting(state))
        return backends[-1]

    fleet = InProcessFleet(redis_client, key_prefix, fleet_file, backend=backend)
    fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.state is S.AWAITING_APPROVAL and rec.held is not None
    assert rec.held.reason is HoldReason.FREEZE and backends[0].calls["issue_refund"] == 0
    shown = api.get(f"/v1/trajectories/{tid}", headers=auth).json()
    assert shown["held_approval"]["reason"] == "freeze", "the wait's reason is visible"
    inbox = api.get("/v1/approvals", headers=auth).json()["items"]
    assert inbox == [], "a write held by a freeze is no request for a reviewer"

    lifted = api.post(f"/v1/trajectories/{tid}/freeze", json={"frozen": False}, headers=auth)
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["state"] == "WAITING_TOOL"
    (turn,) = [TurnMessage.from_payload(p) for p in sent]
    fleet.runner.run(turn)
    fleet.run_until_quiet()
    assert backends[0].calls["issue_refund"] == 1
    assert fleet.load("acme", tid).state is S.COMPLETED


def test_a_tenant_is_frozen_by_an_operator_key_and_an_unknown_one_is_refused(
    api: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str, applied: int
) -> None:
    op = keys.auth(keys.operator)
    done = api.post("/v1/tenants/acme/freeze", headers=op)
    assert done.status_code == 200, done.text
    fleet = fleet_config.require(redis_client, key_prefix)
    assert fleet.version == applied + 1
    acme = fleet.authority.of("acme")
    assert acme is not None and acme.frozen
    unknown = api.post("/v1/tenants/initech/freeze", headers=op)
    assert unknown.status_code in (400, 422), unknown.text
    assert unknown.json()["field"] == "authority.tenants.initech"
    tool = api.post("/v1/tenants/acme/grants", json={"tools": ["drop_database"]}, headers=op)
    assert tool.json()["field"] == "authority.tenants.acme.grants.tools", tool.text
    assert fleet_config.stored_version(redis_client, key_prefix) == applied + 1, "nothing changed"
    tenant_key = api.post("/v1/tenants/acme/freeze", headers=keys.auth(keys.acme))
    assert tenant_key.status_code == 403


def test_reins_freeze_and_grants_set_a_trajectorys_through_the_api_process(
    api_url: str, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    from tests.api.test_cli_client import reins as client_reins

    out = client_reins(api_url, keys.acme, "submit", "--agent", AGENT, "--goal", "g", "--json")
    assert out.returncode == 0, out.stderr
    tid = json.loads(out.stdout)["trajectory_id"]
    frozen = client_reins(api_url, keys.acme, "freeze", "--trajectory", tid, "--json")
    assert frozen.returncode == 0, frozen.stderr
    granted = client_reins(
        api_url, keys.acme, "grants", "--trajectory", tid, "--tools", "get_order", "--read-only"
    )
    assert granted.returncode == 0, granted.stderr
    rec = RedisStore(redis_client, prefix=key_prefix).load("acme", tid)
    assert rec.grants.frozen and rec.grants.read_only and rec.grants.tools == ["get_order"]
    lifted = client_reins(api_url, keys.acme, "freeze", "--trajectory", tid, "--off")
    assert lifted.returncode == 0, lifted.stderr
    assert not RedisStore(redis_client, prefix=key_prefix).load("acme", tid).grants.frozen
    other = client_reins(api_url, keys.globex, "freeze", "--trajectory", tid)
    assert other.returncode == 2 and "404" in other.stderr, "another tenant's id is not found"
