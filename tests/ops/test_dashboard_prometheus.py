"""Every panel of the fairness dashboard, run against a real Prometheus scraping reins metrics.

A simulated fleet (tests/ops/workload.py: the real admitter, tenants of weights 3:2:1, real kernel
runs) reports through :class:`ops.observability.metrics.Metrics`, served on 127.0.0.1; a Prometheus
started by this test scrapes it. The workload runs in slices, each followed by a scrape, so every
counter has samples that rise. Then each panel's PromQL must return finite data, and the
charge-share panel must show the weights' shares.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from ops.observability import dashboard
from ops.observability.metrics import Metrics
from tests.ops.prometheus import PrometheusServer, expand, find_prometheus
from tests.ops.workload import WEIGHTS, Workload, expected_shares

SLICES = 4


@pytest.fixture(scope="module")
def scraped() -> Iterator[tuple[PrometheusServer, Workload]]:
    binary = find_prometheus()
    if binary is None:
        pytest.skip("no prometheus binary: run ops/scripts/ensure-prometheus.sh (make tools)")
    metrics = Metrics()
    server = metrics.serve("127.0.0.1", 0)
    try:
        workload = Workload(metrics)
        with PrometheusServer(binary, [f"127.0.0.1:{server.port}"]) as prom:
            prom.wait_scraped_after(time.time())  # the zero values of the declared series
            for _ in range(SLICES):
                workload.chunk()
                prom.wait_scraped_after(time.time())
            yield prom, workload
    finally:
        server.close()


def test_every_fairness_panel_returns_finite_data(
    scraped: tuple[PrometheusServer, Workload],
) -> None:
    """The simulated workload has no worker processes: the fleet-health row is checked against
    a real fleet (tests/ops/test_dashboard_fleet.py)."""
    prom, _ = scraped
    empty = []
    fairness = {p.title for p in dashboard.FAIRNESS}
    for title, ref, expr in dashboard.queries():
        if title not in fairness:
            continue
        samples = prom.query(expand(expr))
        values = [float(s["value"][1]) for s in samples]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{title} [{ref}]: {expand(expr)} -> {values}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_charge_share_follows_the_weights(scraped: tuple[PrometheusServer, Workload]) -> None:
    prom, workload = scraped
    share_expr = dashboard.queries()[0][2]
    measured = {s["metric"]["tenant"]: float(s["value"][1]) for s in prom.query(expand(share_expr))}
    print("measured shares:", measured, "ground truth:", workload.shares())
    assert set(measured) == set(WEIGHTS)
    for tenant, expected in expected_shares().items():
        assert measured[tenant] == pytest.approx(expected, abs=0.01), (tenant, measured)
        # what Prometheus computed is what the workload admitted
        assert measured[tenant] == pytest.approx(workload.shares()[tenant], abs=1e-6)
    assert sum(measured.values()) == pytest.approx(1.0, abs=1e-9)


def test_selecting_a_tenant_shows_its_share_of_the_whole(
    scraped: tuple[PrometheusServer, Workload],
) -> None:
    prom, _ = scraped
    share_expr = dashboard.queries()[0][2]
    (only,) = prom.query(expand(share_expr, tenant="initech"))
    assert only["metric"]["tenant"] == "initech"
    assert float(only["value"][1]) == pytest.approx(expected_shares()["initech"], abs=0.01)


def test_tenant_variable_lists_the_configured_tenants(
    scraped: tuple[PrometheusServer, Workload],
) -> None:
    prom, _ = scraped
    variable = next(v for v in dashboard.build()["templating"]["list"] if v["name"] == "tenant")
    definition = variable["definition"]
    metric = definition[len("label_values(") : definition.rindex(",")]
    assert set(prom.api("label/tenant/values", **{"match[]": expand(metric)})) == set(WEIGHTS)


def test_jain_index_is_near_one_while_everyone_is_backlogged(
    scraped: tuple[PrometheusServer, Workload],
) -> None:
    prom, _ = scraped
    (jain,) = prom.query("min(reins_fairness_jain_index)")
    assert 0.95 <= float(jain["value"][1]) <= 1.0


def test_stops_and_spend_come_from_real_kernel_runs(
    scraped: tuple[PrometheusServer, Workload],
) -> None:
    prom, workload = scraped
    stops = {
        s["metric"]["stop_reason"]: float(s["value"][1])
        for s in prom.query("sum by (stop_reason) (reins_trajectory_stops_total)")
    }
    # the workload alternates a default budget (the refund completes) and max_steps=2
    assert stops == {
        **dict.fromkeys(stops, 0.0),
        "done": workload.runs / 2,
        "max_steps": workload.runs / 2,
    }
    (conflicts,) = prom.query("sum(reins_store_conflicts_total)")
    assert float(conflicts["value"][1]) == workload.conflicts == SLICES
    (spend,) = prom.query("sum(reins_spend_dollars_total)")
    assert float(spend["value"][1]) > 0
