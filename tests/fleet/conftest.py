"""Fixtures of the fleet tests: tenant and gate files, an in-process fleet, real processes.

Every key a test creates starts with its ``key_prefix``; the broker runs under the same prefix
and database as the store, so the shared cleanup removes Celery's keys too. A test that takes
the ``broker`` fixture with ``amqp`` (``@pytest.mark.parametrize("broker", BROKERS,
indirect=True)``) runs its fleet on the machine's RabbitMQ instead, its member queues named
under the same prefix and deleted after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ops.local.fleet import LocalFleet
from tests.conftest import REDIS_URL
from tests.fleet.brokers import AMQP_URL, delete_member_queues, require_rabbitmq
from tests.fleet.harness import InProcessFleet

WEIGHTS = {"acme": 3, "globex": 2, "initech": 1}
ROUTE = "scripted/refund-policy"


#: The agents the fleet tests' tenants may run (the fleet's document lists each tenant's).
FLEET_AGENTS = (
    "examples.support_store:agent",
    "examples.support_store:agent_lookup",
    "examples.support_store:agent_routed",
    "examples.support_store:agent_local",
    "examples.support_store:agent_reporting",
    "examples.support_store:agent_rewoo",
    "examples.support_store:agent_plan",
    "examples.support_store.notes:agent",
    "examples.support_store.notes:agent_trusting",
    "examples.support_store.remembering:agent",
)


def tenants_toml(max_steps: int = 40, agents: tuple[str, ...] = FLEET_AGENTS) -> str:
    """Three tenants, weights 3:2:1, a small quantum so shares settle within a few rounds; a
    fleet document, which a process given it as its tenants file applies at boot."""
    parts = ["quantum_tokens = 1000\ncredit_cap_tokens = 12000\n"]
    listed = json.dumps(list(agents))
    for name, weight in WEIGHTS.items():
        parts.append(
            f'[[tenants]]\nname = "{name}"\nweight = {weight}\nmax_ready = 1000\n'
            f"largest_call_tokens = 8000\nbudget_max = {{ steps = {max_steps} }}\n"
            f"agents = {listed}\n"
        )
    return "\n".join(parts)


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(tenants_toml())
    return path


@pytest.fixture
def gates_file(tmp_path: Path) -> Path:
    """One provider gate, concurrency 6: the bottleneck of the fairness runs."""
    path = tmp_path / "gates.json"
    path.write_text(json.dumps({"routes": {ROUTE: {"concurrency": 6, "lease_ttl_s": 20}}}))
    return path


#: What a test parametrizes ``broker`` over to run on both (``-m "not amqp"`` leaves RabbitMQ out).
BROKERS = ["redis", pytest.param("amqp", marks=pytest.mark.amqp)]


@pytest.fixture
def broker(request: pytest.FixtureRequest) -> str:
    """The broker URL of this test's fleet: the store's Redis database (the default), or with
    ``amqp`` the machine's RabbitMQ (checked to answer first)."""
    kind = getattr(request, "param", "redis")
    if kind == "amqp":
        require_rabbitmq()
        return AMQP_URL
    return REDIS_URL  # same database: the prefix cleanup covers Celery's keys


@pytest.fixture
def fleet_env(key_prefix: str, tenants_file: Path, broker: str) -> dict[str, str]:
    """The settings of fleet subprocesses: this test's prefix, loopback Redis, fast heartbeats."""
    return {
        "REINS_KEY_PREFIX": key_prefix,
        "REINS_REDIS_URL": REDIS_URL,
        "REINS_BROKER_URL": broker,
        "REINS_TENANTS_FILE": str(tenants_file),
        "REINS_HEARTBEAT_INTERVAL_S": "0.25",
        "REINS_HEARTBEAT_TIMEOUT_S": "3",
        "REINS_SCRIPTED_LATENCY_S": "0",
        "REINS_WORKER_CONCURRENCY": "32",
        "REINS_DRAIN_GRACE_S": "10",
        "REINS_VISIBILITY_TIMEOUT_S": "4",
        "REINS_MAX_TURN_S": "3",
        "REINS_STALL_TIMEOUT_S": "30",
    }


@pytest.fixture
def local_fleet(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> Iterator[LocalFleet]:
    """Worker and router processes this test starts; every one is ended at teardown."""
    yield from _processes(fleet_env, tmp_path, redis_client)


def _processes(env: dict[str, str], tmp_path: Path, client: redis.Redis) -> Iterator[LocalFleet]:
    fleet = LocalFleet(env, tmp_path, client)
    try:
        yield fleet
    finally:
        fleet.close()
        delete_member_queues(env, fleet.procs)


@pytest.fixture
def inproc(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> Iterator[InProcessFleet]:
    """A router and a turn runner in this process, on the real Redis, without Celery."""
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file)
    yield fleet


@pytest.fixture
def document_env(fleet_env: dict[str, str]) -> dict[str, str]:
    """The fleet's settings without a tenants file: every process reads the document."""
    return {k: v for k, v in fleet_env.items() if k != "REINS_TENANTS_FILE"}


@pytest.fixture
def document_fleet(
    document_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> Iterator[LocalFleet]:
    """As ``local_fleet``, for processes that read the fleet's document."""
    yield from _processes(document_env, tmp_path, redis_client)
