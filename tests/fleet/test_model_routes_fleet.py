"""Routes in the fleet, on real processes: two routers and two Celery workers run agents whose
model the fleet's document routes to two deployments, A (OpenAI-compatible) then B (Anthropic).
A answers every request with 429 and a long retry-after; B serves. Every trajectory finishes on
B; A's gate backs off after its first refusals, so A sees no more requests than its gate lets be
in flight at once; the chain names the route each model call took, and the routes it fell back
from; the provider keys, held in the workers' environment, appear in no record, chain row or
log line."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from examples.support_store.policies import RefundPolicy
from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from store.redis_store import RedisStore
from tests.fleet.documents import config_apply, fleet_document
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import caller_api, start, stop_all, wait_all_ended
from tests.providers.fake_anthropic import view_of
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from tests.providers.scripts import policy_script
from tests.support.otlp import OtlpReceiver, receiver
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
AGENT = "examples.support_store:agent_routed"  # provider "routes", model "refund-policy"
A_CONCURRENCY = 2  # A's gate: requests that may be out on A when its first 429 comes back
TRAJECTORIES = 12
KEYS = {"ROUTE_A_KEY": "sk-a-4f1c9e2d7b", "ROUTE_B_KEY": "sk-b-8e3a6c1f5d"}


def refund_policy(request: dict[str, Any], n: int) -> Reply:
    goal = json.loads(view_of(request))["goal"]
    return policy_script(RefundPolicy.from_goal(goal, latency=0.01))(request, n)


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    yield from receiver()


@pytest.fixture
def route_a() -> Iterator[FakeProvider]:
    """Refuses every request: 429, retry after ten minutes."""
    refuse = Reply(status=429, headers={"retry-after": "600"})
    with FakeProvider(lambda request, n: refuse) as server:
        yield server
    assert not server.errors, server.errors


@pytest.fixture
def route_b() -> Iterator[FakeProvider]:
    with FakeProvider(refund_policy) as server:
        yield server
    assert not server.errors, server.errors


def models(a: FakeProvider, b: FakeProvider) -> str:
    return f"""
[models."refund-policy"]
price = {{ input_per_m = "3", cached_input_per_m = "0.30", output_per_m = "15" }}
gates = {{ concurrency = 8, lease_ttl_s = 20 }}
[[models."refund-policy".routes]]
name = "a"
protocol = "openai-compatible"
base_url = "{a.base_url}"
api_key_env = "ROUTE_A_KEY"
gates = {{ concurrency = {A_CONCURRENCY}, lease_ttl_s = 20 }}
[[models."refund-policy".routes]]
name = "b"
protocol = "anthropic"
base_url = "{b.root_url}"
api_key_env = "ROUTE_B_KEY"
gates = {{ concurrency = 8, lease_ttl_s = 20 }}
"""


def test_a_refusing_route_is_passed_over_and_every_trajectory_finishes_on_the_other(
    document_fleet: LocalFleet,
    document_env: dict[str, str],
    route_a: FakeProvider,
    route_b: FakeProvider,
    collector: OtlpReceiver,
) -> None:
    client = document_fleet.client
    prefix, doc = document_env["REINS_KEY_PREFIX"], document_fleet.log_dir / "fleet.toml"
    doc.write_text(fleet_document({"acme": 1}, agent=AGENT, gate="") + models(route_a, route_b))
    config_apply(document_env, doc)
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    start(document_fleet, env={**KEYS, **traced})
    api = caller_api(document_env, client, "redis", None)
    orders = seed_orders(client, prefix, 3000, TRAJECTORIES)
    ids = [("acme", api.submit("acme", refund_job(o, agent=AGENT)).trajectory_id) for o in orders]
    store = RedisStore(client, prefix=prefix)
    wait_all_ended(store, ids, 240, document_fleet)

    routes: Counter[str] = Counter()
    fell_back: Counter[str] = Counter()
    for tenant, tid in ids:
        rec = store.load(tenant, tid)
        assert rec.stop_reason is StopReason.DONE, (tid, rec.stop_reason, rec.last_observation)
        model_rows = [r for r in store.read(tenant, tid) if r.kind.value == "model"]
        assert model_rows, tid
        for row in model_rows:
            detail = row.detail or {}
            routes[detail.get("route", "-")] += 1
            fell_back.update(detail.get("fell_back", []))
        text = rec.model_dump_json() + "".join(r.model_dump_json() for r in model_rows)
        assert not any(key in text for key in KEYS.values()), "a key reached the record"
    print(f"\nroutes {dict(routes)}, fell back {dict(fell_back)}, A saw {len(route_a.seen)}")
    assert set(routes) == {"b"}  # every model call was answered by B
    assert routes["b"] == len(route_b.seen)
    assert 1 <= len(route_a.seen) <= A_CONCURRENCY  # A backed off after its first refusals
    # each call tried A first: refused by A itself, or by A's gate (paused, or both of its
    # slots out when the first refusals were on their way back)
    assert sum(fell_back.values()) == routes["b"]
    assert fell_back["a: REJECTED"] == len(route_a.seen)
    assert set(fell_back) <= {"a: REJECTED", "a: gate paused", "a: gate concurrency"}
    assert fell_back["a: gate paused"] > 0
    assert route_a.seen[0].headers["authorization"] == f"Bearer {KEYS['ROUTE_A_KEY']}"
    assert route_b.seen[0].headers["x-api-key"] == KEYS["ROUTE_B_KEY"]
    gate_a = RedisGates(client, GateConfig(routes={}), prefix=prefix).reading(
        "routes/refund-policy/a"
    )
    assert gate_a.paused_until > time.time() + 500 and gate_a.leases == 0

    def chat_spans() -> list[Any]:
        return [s for s in collector.taken() if s.name.startswith("chat")]

    wait_for(lambda: len(chat_spans()) >= routes["b"], 30, "a span for every model call")
    assert stop_all(document_fleet) == {"r1": 0, "r2": 0, "w1": 0, "w2": 0}
    assert {s.attributes.get("reins.route") for s in chat_spans()} == {"b"}
    spans = repr([(s.name, s.attributes) for s in collector.taken()])
    assert not any(key in spans for key in KEYS.values()), "a key reached a span"
    logs = "".join(p.read_text() for p in document_fleet.log_dir.glob("*.log"))
    assert logs and not any(key in logs for key in KEYS.values()), "a key reached a log"
