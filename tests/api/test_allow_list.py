"""Agents by allow-list: the worker refuses a record whose agent its tenant may not run, without
importing it; the fleet's document must list every tenant's agents."""

from __future__ import annotations

import sys
import tomllib

import pytest
import redis

from kernel.budget import Budget
from kernel.errors import ConfigError
from kernel.record import TrajectoryRecord
from router.fleet import config as fleet_config
from router.fleet.config import ConfigSource
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, fleet_toml
from worker.allowed import AgentNotAllowed, AllowListedStore

pytestmark = pytest.mark.redis


def _record(tenant: str, agent: str) -> TrajectoryRecord:
    return TrajectoryRecord.create(
        trajectory_id=f"traj-{agent.replace(':', '-')}",
        tenant=tenant,
        user="u",
        goal="g",
        agent=agent,
        budget=Budget(),
        now=0.0,
    )


def test_the_worker_refuses_a_record_of_an_agent_its_tenant_may_not_run(
    redis_client: redis.Redis, key_prefix: str, applied: int
) -> None:
    plain = RedisStore(redis_client, prefix=key_prefix)
    allowed, smuggled = _record("acme", AGENT), _record("acme", "this:agent")
    plain.create(allowed)
    plain.create(smuggled)  # as a client of an older build could have written it
    worker_store = AllowListedStore(redis_client, prefix=key_prefix)
    worker_store.source = ConfigSource(redis_client, key_prefix)
    imported_before = "this" in sys.modules

    assert worker_store.load("acme", allowed.trajectory_id).agent == AGENT
    with pytest.raises(AgentNotAllowed, match="not allowed for tenant 'acme'"):
        worker_store.load("acme", smuggled.trajectory_id)
    assert ("this" in sys.modules) == imported_before


def test_a_new_version_is_seen_and_a_document_without_agents_is_refused(
    redis_client: redis.Redis, key_prefix: str, applied: int
) -> None:
    source = ConfigSource(redis_client, key_prefix, refresh_s=0.0)
    assert source.current().version == applied
    assert source.current().allows("acme", AGENT)
    data = tomllib.loads(fleet_toml(agents=("examples.support_store:agent_lookup",)))
    assert fleet_config.apply(redis_client, key_prefix, data) == applied + 1
    assert not source.current().allows("acme", AGENT)
    assert source.current().allows("acme", "examples.support_store:agent_lookup")

    without = tomllib.loads(fleet_toml().replace('agents = ["examples.support_store:agent"]', ""))
    with pytest.raises(ConfigError, match="list no agents"):
        fleet_config.apply(redis_client, key_prefix, without)
    assert source.current().version == applied + 1, "a refused document changed the version"


def test_the_apis_submissions_take_the_gated_route_of_the_fleets_document(
    redis_client: redis.Redis, key_prefix: str, api_env: dict[str, str]
) -> None:
    from api.front import Front
    from kernel.settings import Settings

    data = tomllib.loads(fleet_toml())
    data["gates"] = {"routes": {"scripted/refund-policy": {"concurrency": 4}}}
    fleet_config.apply(redis_client, key_prefix, data)
    front = Front.wire(Settings.from_env(api_env), client=redis_client)
    job = {"agent": AGENT, "goal": "refund ord_1", "user": "cu_ana"}
    done, created = front.submit("acme", job, None)
    assert created and done.route == "scripted/refund-policy", "queued without its gate"
    assert list(redis_client.scan_iter(match=f"{{{key_prefix}:adm}}*")) == [], "limits written"
