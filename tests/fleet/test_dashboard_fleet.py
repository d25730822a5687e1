"""Every dashboard panel against a real Prometheus scraping a real fleet run.

A router and worker processes serve ``/metrics`` on loopback; a Prometheus this test starts
scrapes them with a ``namespace`` label, as the chart's would. First a slow worker (one thread,
each model call seconds long) holds queued turns: the queue-depth panel must agree with the
queue's length as the test reads it from the broker, and the oldest-age panel must be within
what the test can bound. Then two fast workers under one worker label (pods of one Deployment)
run refunds to the end: every panel's query returns finite data, the affinity panel's hit rate
is what the test counts from the records (the ring did not change, so every turn after a
trajectory's first is a hit, and there are exactly that many), and another namespace's
selection sees none of it.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import redis

from kernel.settings import Settings
from ops.local.fleet import LocalFleet
from ops.observability import dashboard
from router.wire.broker import broker_keyprefix, queue_for
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.fleet.harness import refund_job, seed_orders, submit_refunds
from tests.fleet.processes import BACKEND, caller_api, stop_all, wait_all_ended
from tests.ops.prometheus import PrometheusServer, expand, find_prometheus, free_port
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
NAMESPACE = "reins-test"
SLOW, FAST = "slow-pool", "pool"  # the worker labels: what a Deployment's name would be
HELD = 4  # trajectories sent to the slow worker at once


def panel(title: str) -> list[str]:
    """The queries of the panel called ``title``."""
    found = [expr for t, _, expr in dashboard.queries() if t == title]
    assert found, title
    return found


def values(prom: PrometheusServer, expr: str, by: str = "") -> dict[str, float]:
    """The query as the dashboard's defaults run it, in this test's namespace."""
    samples = prom.query(expand(expr, namespace=NAMESPACE, job="reins"))
    return {s["metric"].get(by, ""): float(s["value"][1]) for s in samples}


def recovered(prom: PrometheusServer, instances: list[str]) -> float:
    """Turns recovered, as the processes at ``instances`` counted them."""
    expr = f'sum(reins_recoveries_total{{instance=~"{"|".join(instances)}"}})'
    (sample,) = prom.query(expr)
    return float(sample["value"][1])


def test_every_panel_against_a_real_fleet(
    local_fleet: LocalFleet,
    fleet_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    gates_file: Path,
) -> None:
    binary = find_prometheus()
    if binary is None:
        pytest.skip("no prometheus binary: run ops/scripts/ensure-prometheus.sh (make tools)")
    ports = {name: free_port() for name in ("r1", "w1", "w2", "w3")}
    targets = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    long_turns = {  # a model call of seconds must fit a turn
        "REINS_MAX_TURN_S": "20",
        "REINS_VISIBILITY_TIMEOUT_S": "40",
        "REINS_STALL_TIMEOUT_S": "60",
        # the ring must not change under a loaded machine: the affinity count assumes it
        "REINS_HEARTBEAT_TIMEOUT_S": "20",
    }

    def env(name: str, label: str = "") -> dict[str, str]:
        out = {**long_turns, "REINS_METRICS_PORT": str(ports[name])}
        return {**out, "REINS_METRICS_WORKER_LABEL": label} if label else out

    caller_env = {**fleet_env, **long_turns}
    api = caller_api(caller_env, redis_client, "redis", gates_file)
    store = RedisStore(redis_client, prefix=key_prefix)
    with PrometheusServer(binary, list(targets.values()), labels={"namespace": NAMESPACE}) as prom:
        # --- a slow worker's queue holds still while its one thread waits on a model --------
        local_fleet.start(
            "worker", "w3", "--backend", BACKEND, "--concurrency", "1",
            "--model-latency-s", "8", env=env("w3", SLOW),
        )  # fmt: skip
        gates = ["--gates", str(gates_file)]  # concurrency 6: the fast run meets refusals
        local_fleet.start("router", "r1", "--admitter", "redis", *gates, env=env("r1"))
        local_fleet.wait_ready(["w3"], ["r1"])
        began = time.time()
        orders = seed_orders(redis_client, key_prefix, 700, HELD + 9)
        held = [("acme", api.submit("acme", refund_job(o)).trajectory_id) for o in orders[:HELD]]
        queue = broker_keyprefix(Settings.from_env(caller_env)) + queue_for("w3")
        (depth_query,) = panel("Queue depth per worker")

        def queue_agrees() -> bool:
            waiting = int(redis_client.llen(queue))
            shown = values(prom, depth_query, "worker").get(SLOW)
            held_back = waiting >= HELD - 2  # one runs, at most one more is prefetched
            still = int(redis_client.llen(queue)) == waiting  # it held still meanwhile
            return held_back and shown == waiting and still

        wait_for(queue_agrees, 60, "the queue-depth panel to show the queue the test reads")
        (age_query,) = panel("Oldest queued turn per worker")
        age = values(prom, age_query, "worker")[SLOW]
        assert 0 < age <= time.time() - began
        for tenant, tid in held:  # free the slow worker: its queued turns go stale
            api.control(tenant, tid, "cancel", "ops")
        wait_all_ended(store, held, 60, local_fleet)
        assert local_fleet.stop("w3") == 0
        prom.wait_scraped_after(time.time(), targets=[targets["r1"]])
        recovered_before = recovered(prom, [targets["r1"]])
        # --- two fast workers of one Deployment run refunds to the end ----------------------
        for name in ("w1", "w2"):
            local_fleet.start("worker", name, "--backend", BACKEND, env=env(name, FAST))
        local_fleet.wait_ready(["w1", "w2"], ["r1"])
        ids = submit_refunds(api, orders[HELD:], [*WEIGHTS])
        wait_all_ended(store, ids, 120, local_fleet)
        live = [targets[n] for n in ("r1", "w1", "w2")]
        prom.wait_scraped_after(time.time() + 1.0, targets=live)  # past a heartbeat's report

        empty = []
        for title, ref, expr in dashboard.queries():
            samples = prom.query(expand(expr, namespace=NAMESPACE, job="reins"))
            got = [float(s["value"][1]) for s in samples]
            if not any(math.isfinite(v) for v in got):
                empty.append(f"{title} [{ref}]: {expr} -> {got}")
        assert not empty, "panels without data:\n" + "\n".join(empty)

        # affinity: the test's own count from the records, against the panel and the counters
        turns_after_first = sum(store.load(t, i).turn - 1 for t, i in ids)
        assert turns_after_first > 0
        (hit_rate,) = panel("Placement affinity hit rate")
        assert values(prom, hit_rate) == {"": 1.0}
        counted = values(prom, "sum by (placement) (reins_turn_affinity_total)", "placement")
        assert counted == {"hit": turns_after_first, "miss": 0}
        assert recovered(prom, live) == recovered_before, "the ring stood still: none recovered"
        # the pods of one Deployment share a label; the info series names each pod
        info = prom.query(f'reins_worker_info{{namespace="{NAMESPACE}"}}')
        assert {(s["metric"]["worker"], s["metric"]["member"]) for s in info} == {
            (FAST, "w1"),
            (FAST, "w2"),
        }
        # another release's namespace sees none of this one's series
        for _, _, expr in dashboard.queries():
            assert not prom.query(expand(expr, namespace="elsewhere")), expr
    assert all(code == 0 for code in stop_all(local_fleet).values())
