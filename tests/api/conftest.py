"""Fixtures of the API tests: the fleet's document applied under the test's prefix, API keys,
and the application over the real Redis (in process, through httpx's ASGI transport)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.app import create_app
from api.front import Front
from api.keys import KeyRing, Scope
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from ops.local.fleet import LocalFleet
from router.fleet import config as fleet_config
from tests.api.processes import fleet_env, start_api
from tests.conftest import REDIS_URL

AGENT = "examples.support_store:agent"


def without_error_id(body: bytes) -> bytes:
    """A problem ``body`` with its ``error_id``'s value blanked: the id is new for every error
    (its log line's), so two refusals that must be alike are compared without it."""
    blanked, found = re.subn(rb'"error_id":"[0-9a-f]{16}"', b'"error_id":""', body)
    assert found == 1, body
    return blanked


TENANTS = ("acme", "globex")


def fleet_toml(agents: tuple[str, ...] = (AGENT,)) -> str:
    """Two tenants, each allowed ``agents``."""
    listed = ", ".join(f'"{a}"' for a in agents)
    parts = ["quantum_tokens = 1000\ncredit_cap_tokens = 12000\n"]
    for name, weight in zip(TENANTS, (3, 1), strict=True):
        parts.append(
            f'[[tenants]]\nname = "{name}"\nweight = {weight}\nmax_ready = 1000\n'
            f"largest_call_tokens = 8000\nagents = [{listed}]\n"
        )
    return "\n".join(parts)


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(fleet_toml())
    return path


@pytest.fixture
def api_env(key_prefix: str) -> dict[str, str]:
    return {
        "REINS_KEY_PREFIX": key_prefix,
        "REINS_REDIS_URL": REDIS_URL,
        "REINS_BROKER_URL": REDIS_URL,
    }


@pytest.fixture
def applied(redis_client: redis.Redis, key_prefix: str, fleet_file: Path) -> int:
    """The fleet's document, applied under this test's prefix; its version."""
    return fleet_config.apply(redis_client, key_prefix, fleet_config.read_file(fleet_file))


@dataclass(frozen=True)
class Keys:
    """API keys of the tests: every tenant scope per tenant, narrower ones, an operator's."""

    acme: str
    globex: str
    acme_read_only: str
    operator: str

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(redis_client: redis.Redis, key_prefix: str) -> Keys:
    ring = KeyRing(redis_client, key_prefix)
    every = {Scope.SUBMIT, Scope.READ, Scope.CONTROL, Scope.DECIDE}
    return Keys(
        acme=ring.create("acme", "reviewer", every)[0],
        globex=ring.create("globex", "reviewer", every)[0],
        acme_read_only=ring.create("acme", "auditor", {Scope.READ})[0],
        operator=ring.create(None, "ops", {Scope.OPERATOR})[0],
    )


@pytest.fixture
def http(api_env: dict[str, str], redis_client: redis.Redis, applied: int) -> Iterator[TestClient]:
    """The API in this process over the real Redis (nothing listens on a port)."""
    settings = Settings.from_env(api_env)
    app = create_app(settings, Front.wire(settings, client=redis_client))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture
def fleet(
    key_prefix: str, tmp_path: Path, redis_client: redis.Redis, applied: int
) -> Iterator[LocalFleet]:
    """The fleet's processes on this test's prefix (started by the test, ended by PID)."""
    processes = LocalFleet(fleet_env(key_prefix), tmp_path, redis_client)
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def api_url(fleet: LocalFleet) -> str:
    """The API as a process of its own (no router, no worker) on a loopback port."""
    return start_api(fleet)


@pytest.fixture
def acme_held(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str, fleet_file: Path
) -> TrajectoryRecord:
    """A refund of tenant acme, submitted through the API and held for a reviewer."""
    from tests.api.held import held_refund  # it builds on this module's fixtures' values

    rec = held_refund(http, keys.auth(keys.acme), redis_client, key_prefix, fleet_file)
    assert rec.held is not None
    return rec
