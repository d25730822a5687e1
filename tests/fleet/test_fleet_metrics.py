"""Prometheus metrics of the fleet's own processes: what the router and the workers report.

In process: a router service and a turn runner on the real Redis, both watched by one
:class:`ops.observability.metrics.Metrics`; every counter is checked against the ground truth in
Redis (the admissions the router recorded, the execution chains, the records' stop reasons), so a
commit site that reports twice, or not at all, fails. As processes: one worker and one router with
``REINS_METRICS_PORT`` set serve ``/metrics``, scraped over HTTP after their jobs ended.
"""

from __future__ import annotations

import math
import re
import socket
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from kernel.chain import RowKind
from kernel.events import ReplyStatus
from kernel.states import TERMINAL, LifecycleState, StopReason
from ops.local.fleet import LocalFleet
from ops.observability import dashboard
from ops.observability.metrics import OTHER, TOOL_OUTCOMES, Metrics
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders, submit_refunds
from tests.fleet.processes import BACKEND, caller_api, stop_all, wait_all_ended
from tests.support import wait_for

pytestmark = pytest.mark.redis
TENANTS = list(WEIGHTS)
PROVIDER = "scripted"  # the support store's model, and the provider of the gate's route

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples_of(metrics: Metrics) -> Samples:
    """Every ``reins_*`` sample of ``metrics``: (name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in metrics.registry.collect()
        if fam.name.startswith("reins_")
        for s in fam.samples
    }


def by(samples: Samples, name: str, *labels: str) -> defaultdict[tuple[str, ...], float]:
    """The non-zero samples called ``name``, summed by the given labels (0 for the others)."""
    out: defaultdict[tuple[str, ...], float] = defaultdict(float)
    for (n, pairs), v in samples.items():
        if n == name and v:
            d = dict(pairs)
            out[tuple(d[label] for label in labels)] += v
    return out


def test_the_router_and_the_turn_runner_report_what_happened(
    redis_client: redis.Redis,
    key_prefix: str,
    tenants_file: Path,
    gates_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics = Metrics(process_metrics=False)
    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, gates_file=str(gates_file), observer=metrics
    )
    orders = seed_orders(redis_client, key_prefix, 700, 12)
    ids = []
    for i, oid in enumerate(orders[:9]):
        tenant = TENANTS[i % len(TENANTS)]
        ids.append((tenant, fleet.api.submit(tenant, refund_job(oid)).trajectory_id))
    # ends at admission, on the router (the dispatcher's commit)
    stopped = {**refund_job(orders[9]), "budget": {"max_steps": 0}}
    ids.append(("acme", fleet.api.submit("acme", stopped).trajectory_id))
    # canceled before it is admitted (the router API's commit)
    canceled = fleet.api.submit("globex", refund_job(orders[10])).trajectory_id
    fleet.api.control("globex", canceled, "cancel", "ops")
    ids.append(("globex", canceled))
    # paused between the dispatcher's load and its compare-and-set: the dispatcher loses
    raced = fleet.api.submit("initech", refund_job(orders[11])).trajectory_id
    ids.append(("initech", raced))
    store = fleet.service.dispatcher.store
    real_load = store.load

    def load_then_pause(tenant: str, trajectory_id: str):  # type: ignore[no-untyped-def]
        rec = real_load(tenant, trajectory_id)
        if trajectory_id == raced:
            monkeypatch.setattr(store, "load", real_load)
            fleet.api.control(tenant, trajectory_id, "pause", "ops")  # lands before the CAS
        return rec

    monkeypatch.setattr(store, "load", load_then_pause)
    # the gate (concurrency 6) takes six at the first claim and refuses the seventh
    turns = fleet.run_until_quiet()
    assert store.load == real_load and fleet.load("initech", raced).state is LifecycleState.PAUSED
    fleet.api.control("initech", raced, "resume", "ops")
    turns += fleet.run_until_quiet()
    fleet.service.tick()  # writes the admissions; reports the figures and the membership

    s = samples_of(metrics)
    records = [fleet.load(t, i) for t, i in ids]
    assert all(r.state in TERMINAL for r in records)
    # admissions: each one the router recorded, by tenant, with its charge
    admitted = fleet.feed.admissions()
    assert len(admitted) == turns >= len(orders) - 2, "every turn was admitted once"
    assert by(s, "reins_admissions_total", "tenant", "provider") == Counter(
        {(t, PROVIDER): n for t, n in Counter(e["t"] for e in admitted).items()}
    )
    charge: Counter[tuple[str, ...]] = Counter()
    for e in admitted:
        charge[(e["t"],)] += e["c"]
    assert by(s, "reins_admitted_charge_tokens_total", "tenant") == charge
    assert sum(by(s, "reins_admission_wait_seconds_count", "tenant").values()) == turns
    assert by(s, "reins_gate_refusals_total", "provider", "gate")[(PROVIDER, "concurrency")] >= 1
    # turns, and what the chains hold: every commit reported once, wherever it was made
    assert by(s, "reins_turn_duration_seconds_count", "worker") == Counter({("w1",): turns})
    models: Counter[tuple[str, ...]] = Counter()
    tools: Counter[tuple[str, ...]] = Counter()
    stops: Counter[tuple[str, ...]] = Counter()
    for r in records:
        for row in fleet.store.read(r.tenant, r.trajectory_id):
            if row.kind is RowKind.MODEL:
                status = row.outcome if row.outcome in {x.value for x in ReplyStatus} else OTHER
                models[(PROVIDER, status)] += 1
            elif row.kind is RowKind.TOOL and row.outcome != "progress":
                outcome = row.outcome if row.outcome in TOOL_OUTCOMES else OTHER
                tools[(row.tool or OTHER, outcome)] += 1
            elif row.kind is RowKind.STOP:
                stops[(r.tenant, str(row.outcome))] += 1
    assert by(s, "reins_model_calls_total", "provider", "status") == models
    assert by(s, "reins_tool_calls_total", "tool", "outcome") == tools
    assert stops == Counter((r.tenant, r.stop_reason.value) for r in records if r.stop_reason)
    assert by(s, "reins_trajectory_stops_total", "tenant", "stop_reason") == stops
    assert stops[("acme", StopReason.MAX_STEPS.value)] == 1  # ended on the router
    assert stops[("globex", StopReason.CANCELED.value)] == 1  # ended through the API
    assert fleet.load("initech", raced).stop_reason is StopReason.DONE  # resumed after its race
    assert metrics.registry.get_sample_value("reins_store_conflicts_total") == 1
    # the tick: the admitter's figures and the membership
    figures = fleet.service.dispatcher.admitter.figures()
    for t in TENANTS:  # nothing left READY
        assert s[("reins_ready_queue_depth", (("tenant", t),))] == 0
    jain = metrics.registry.get_sample_value("reins_fairness_jain_index")
    assert jain is not None and figures.jain_index is not None
    assert jain == pytest.approx(figures.jain_index)
    assert by(s, "reins_ring_members", "state") == Counter({("active",): 1})
    assert by(s, "reins_tenant_weight", "tenant") == Counter({(t,): w for t, w in WEIGHTS.items()})


# --- the processes --------------------------------------------------------------------------

JOBS = 9


def free_port() -> int:
    """A port nobody listens on now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    """Every sample ``GET /metrics`` on ``127.0.0.1:port`` returns."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


@pytest.mark.slow
def test_a_worker_and_a_router_serve_what_the_dashboard_queries(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    gates_file: Path,
) -> None:
    worker_port, router_port = free_port(), free_port()
    local_fleet.start(
        "worker", "w1", "--backend", BACKEND, env={"REINS_METRICS_PORT": str(worker_port)}
    )
    local_fleet.wait_ready(["w1"], [])
    # queued before the router starts: its first claims pass the gate's concurrency of 6
    api = caller_api(fleet_env, redis_client, "redis", gates_file)
    ids = submit_refunds(api, seed_orders(redis_client, key_prefix, 900, JOBS), TENANTS)
    local_fleet.start(
        "router",
        "r1",
        "--admitter",
        "redis",
        "--gates",
        str(gates_file),
        env={"REINS_METRICS_PORT": str(router_port)},
    )
    local_fleet.wait_ready(["w1"], ["r1"])
    store = RedisStore(redis_client, prefix=key_prefix)
    wait_all_ended(store, ids, 90, local_fleet)
    stop_reasons = Counter((t, store.load(t, i).stop_reason) for t, i in ids)

    def stops_counted() -> bool:  # a worker reports a commit just after it lands
        return sum(by(scrape(worker_port), "reins_trajectory_stops_total").values()) >= JOBS

    wait_for(stops_counted, 30, f"the worker to count {JOBS} stops")
    worker, router = scrape(worker_port), scrape(router_port)

    # every series a dashboard panel queries is served by one process or the other
    queried = {m for _, _, expr in dashboard.queries() for m in re.findall(r"reins_\w+", expr)}
    missing = queried - names(worker) - names(router)
    assert not missing, f"the dashboard queries series no process serves: {missing}"
    assert {"process_cpu_seconds_total", "python_info"} <= names(worker) & names(router)

    # the router: admissions of every tenant, the gate's refusals, the admitter, the ring
    admissions = by(router, "reins_admissions_total", "tenant")
    assert set(admissions) == {(t,) for t in TENANTS} and sum(admissions.values()) >= JOBS
    assert set(by(router, "reins_admitted_charge_tokens_total", "tenant")) == set(admissions)
    waits = by(router, "reins_admission_wait_seconds_count", "tenant")
    assert sum(waits.values()) == sum(admissions.values())
    assert by(router, "reins_gate_refusals_total", "provider")[(PROVIDER,)] >= 1
    assert by(router, "reins_ring_members", "state") == Counter({("active",): 1})
    assert by(router, "reins_tenant_weight", "tenant") == Counter(
        {(t,): w for t, w in WEIGHTS.items()}
    )
    jain = router[("reins_fairness_jain_index", ())]
    assert math.isfinite(jain) and 0 < jain <= 1

    # the worker: its turns, the model's replies, the tools, and one stop per job
    turns = by(worker, "reins_turn_duration_seconds_count", "worker")
    assert set(turns) == {("w1",)} and turns[("w1",)] >= sum(admissions.values())
    assert by(worker, "reins_model_calls_total", "provider", "status")[(PROVIDER, "COMPLETED")]
    assert sum(by(worker, "reins_tool_calls_total", "tool").values()) > 0
    stops = by(worker, "reins_trajectory_stops_total", "tenant", "stop_reason")
    assert stops == Counter({(t, r.value): n for (t, r), n in stop_reasons.items() if r})

    codes = stop_all(local_fleet)
    assert codes == {"r1": 0, "w1": 0}, codes
