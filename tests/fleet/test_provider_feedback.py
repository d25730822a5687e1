"""Provider rate-limit feedback in the fleet, on real processes: two routers and two Celery
workers call a loopback OpenAI-compatible server that allows 3 requests per 1 s window and
answers 429 with ``retry-after-ms`` past that. The fleet's gate allows far more (600 a minute),
so only the provider's answers can hold it back: workers carry each 429 back with the turn's
notice, and the shared gate pauses the route until the window ends. The server never refuses
more requests in one window than the gate had in flight when the first refusal came back, and
never refuses the same trajectory twice in a row within one window."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from examples.support_store.policies import RefundPolicy
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.fleet.documents import config_apply, fleet_document
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import caller_api, start, stop_all, wait_all_ended
from tests.providers.fake_provider import FakeOpenAI
from tests.providers.fake_replies import RateLimit, Reply
from tests.providers.scripts import policy_script, view_of

pytestmark = [pytest.mark.redis, pytest.mark.slow]
AGENT = "examples.support_store:agent_local"  # its profile calls an OpenAI-compatible server
ROUTE = "openai-compatible/refund-policy"
IN_FLIGHT = 2  # the gate's concurrency: requests that may be out when a 429 comes back
TRAJECTORIES = 24


def refund_policy(request: dict[str, Any], n: int) -> Reply:
    """Each request answered by the refund policy of the goal in its view, at once."""
    goal = json.loads(view_of(request))["goal"]
    return policy_script(RefundPolicy.from_goal(goal, latency=0.01))(request, n)


@pytest.fixture
def provider() -> Iterator[FakeOpenAI]:
    """The provider: 3 requests per 1 s window, its 429s saying only retry-after."""
    with FakeOpenAI(refund_policy, RateLimit(requests=3, window_s=1.0, quiet=True)) as server:
        yield server
    assert not server.errors, server.errors


def test_429s_reach_the_shared_gate_and_the_fleet_backs_off(
    document_fleet: LocalFleet, document_env: dict[str, str], provider: FakeOpenAI
) -> None:
    redis_client = document_fleet.client
    key_prefix, doc = document_env["REINS_KEY_PREFIX"], document_fleet.log_dir / "fleet.toml"
    gate = f'[gates.routes."{ROUTE}"]\nrpm = 600\nconcurrency = {IN_FLIGHT}\nlease_ttl_s = 20\n'
    doc.write_text(fleet_document({"acme": 1}, agent=AGENT, gate=gate))
    config_apply(document_env, doc)
    start(document_fleet, worker_args=("--base-url", provider.base_url))
    api = caller_api(document_env, redis_client, "redis", None)
    orders = seed_orders(redis_client, key_prefix, 1000, TRAJECTORIES)
    ids = [("acme", api.submit("acme", refund_job(o, agent=AGENT)).trajectory_id) for o in orders]
    wait_all_ended(RedisStore(redis_client, prefix=key_prefix), ids, 240, document_fleet)

    assert provider.limit is not None
    log = provider.limit.log
    refused = Counter(window for window, no, _ in log if no)
    print(f"\n{len(log)} requests, {sum(refused.values())} refused in {len(refused)} windows")
    assert refused, "the provider's limit was reached: the gate alone did not hold the fleet"
    assert max(refused.values()) <= IN_FLIGHT, f"refusals per window: {refused}"
    last: dict[str, tuple[int, bool]] = {}
    for window, no, request in log:
        goal = json.loads(view_of(request))["goal"]
        before = last.get(goal)
        assert not (no and before == (window, True)), f"{goal} refused twice in window {window}"
        last[goal] = (window, no)
    assert stop_all(document_fleet) == {"r1": 0, "r2": 0, "w1": 0, "w2": 0}
