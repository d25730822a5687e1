"""The Grafana dashboard of per-tenant fairness, built as data and committed as JSON.

:func:`build` returns the dashboard; :func:`write` regenerates the committed JSON (``python -m
ops.observability.dashboard``), which the chart ships for the Grafana sidecar; tests check the
committed file against :func:`build` and run every panel's PromQL against a real Prometheus.
Counters are summed over processes; the admitter's gauges describe one shared state, so they are
taken with ``max``/``min``; a share is of every tenant's charge, not of the selection.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DASHBOARD_PATH = Path(__file__).with_name("dashboards") / "reins-fairness.json"
#: The chart's copy: Helm reads files only from inside the chart directory.
CHART_COPY = Path(__file__).parents[2] / "helm" / "reins" / "dashboards" / "reins-fairness.json"
UID = "reins-fairness"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
PANEL_HEIGHT = 8

#: The deployment's filter, in every query: two releases can share one Prometheus.
S = 'namespace=~"$namespace", job=~"$job"'
T = 'tenant=~"$tenant"'  # the tenant variable's filter
RI = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel and how its series are named in the legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """One panel: its queries, unit and width (panels flow left to right in rows of 24)."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str
    width: int = 12
    kind: str = "timeseries"
    min: float | None = None
    max: float | None = None


def _sel(where: str = "") -> str:
    """A selector: the deployment's filter and ``where``."""
    return "{" + ", ".join(filter(None, (S, where))) + "}"


def _rate(metric: str, by: str, where: str = T) -> str:
    return f"sum by ({by}) (rate({metric}{_sel(where)}[{RI}]))"


def _p99(metric: str, by: str, where: str = "") -> str:
    inner = f"sum by ({by}, le) (rate({metric}_bucket{_sel(where)}[{RI}]))"
    return f"histogram_quantile(0.99, {inner})"


CHARGE = "reins_admitted_charge_tokens_total"

FAIRNESS: tuple[Panel, ...] = (
    Panel(
        "Admitted-charge share per tenant",
        "Each tenant's share of the admitted scheduling charge (input tokens + output "
        "allowance). While tenants stay backlogged, shares follow their weights; the dashed "
        "series is the configured weight share.",
        (
            Query(
                f"{_rate(CHARGE, 'tenant')} / scalar(sum(rate({CHARGE}{_sel()}[{RI}])))",
                "{{tenant}}",
            ),
            Query(
                f"max by (tenant) (reins_tenant_weight{_sel(T)}) / "
                f"scalar(sum(max by (tenant) (reins_tenant_weight{_sel()})))",
                "{{tenant}} weight share",
            ),
        ),
        "percentunit",
        min=0,
        max=1,
    ),
    Panel(
        "Jain's fairness index",
        "Over weight-normalised charge in the admitter's window, among tenants admitted or "
        "queued: 1 is perfectly fair, 1/n is one tenant taking everything.",
        (Query(f"min(reins_fairness_jain_index{_sel()})", "Jain's index"),),
        "none",
        width=6,
        kind="stat",
        min=0,
        max=1,
    ),
    Panel(
        "Admissions per second",
        "Model calls admitted per second, per tenant.",
        (Query(_rate("reins_admissions_total", "tenant"), "{{tenant}}"),),
        "reqps",
        width=6,
    ),
    Panel(
        "Admission wait p99 per tenant",
        "99th percentile of the time a READY call waited before admission.",
        (Query(_p99("reins_admission_wait_seconds", "tenant", T), "{{tenant}}"),),
        "s",
    ),
    Panel(
        "READY queue depth",
        "READY calls waiting per tenant (backpressure shows here, not as failures).",
        (Query(f"max by (tenant) (reins_ready_queue_depth{_sel(T)})", "{{tenant}}"),),
        "short",
    ),
    Panel(
        "Gate refusals per second",
        "Nominations a provider quota gate (RPM, TPM, concurrency) refused; the call stayed READY.",
        (Query(_rate("reins_gate_refusals_total", "provider, gate", ""), "{{provider}} {{gate}}"),),
        "reqps",
        width=8,
    ),
    Panel(
        "DRR credit per tenant",
        "Deficit round-robin credit carried per tenant, in charge tokens.",
        (Query(f"max by (tenant) (reins_drr_credit_tokens{_sel(T)})", "{{tenant}}"),),
        "short",
        width=8,
    ),
    Panel(
        "Spend rate",
        "Settled spend per tenant, in dollars per hour.",
        (Query(f"3600 * {_rate('reins_spend_dollars_total', 'tenant')}", "{{tenant}}"),),
        "currencyUSD",
        width=8,
    ),
    Panel(
        "Stops by reason",
        "Trajectories ending per minute, by stop reason (the closed list).",
        (Query(f"60 * {_rate('reins_trajectory_stops_total', 'stop_reason')}", "{{stop_reason}}"),),
        "short",
    ),
    Panel(
        "Turn duration p99 per worker",
        "99th percentile wall time of one turn on each worker.",
        (Query(_p99("reins_turn_duration_seconds", "worker"), "{{worker}}"),),
        "s",
    ),
    Panel(
        "Model calls by status",
        "Model replies per second by provider and normalised status.",
        (
            Query(
                _rate("reins_model_calls_total", "provider, status", ""), "{{provider}} {{status}}"
            ),
        ),
        "reqps",
        width=8,
    ),
    Panel(
        "Tool calls by outcome",
        "Tool results per second by outcome.",
        (Query(_rate("reins_tool_calls_total", "outcome", ""), "{{outcome}}"),),
        "reqps",
        width=8,
    ),
    Panel(
        "Held approvals",
        "Trajectories waiting for a reviewer's decision.",
        (Query(f"max by (tenant) (reins_approvals_held{_sel(T)})", "{{tenant}}"),),
        "short",
        width=8,
    ),
    Panel(
        "Workers in the ring",
        "Workers by membership state: active, draining, lapsed (heartbeat missed).",
        (Query(f"max by (state) (reins_ring_members{_sel()})", "{{state}}"),),
        "short",
        width=12,
    ),
    Panel(
        "Store compare-and-set conflicts",
        "Commits per second that lost a compare-and-set; the loser reloads and re-decides.",
        (Query(f"sum(rate(reins_store_conflicts_total{_sel()}[{RI}]))", "conflicts"),),
        "reqps",
        width=12,
    ),
)


AFFINITY = "reins_turn_affinity_total"
HIT = 'placement="hit"'

FLEET_HEALTH: tuple[Panel, ...] = (
    Panel(
        "Placement affinity hit rate",
        "Share of turns (after a trajectory's first) that ran on the worker that ran its "
        "previous turn: warm caches and connections. Drains, crashes and ring changes lower it.",
        (
            Query(
                f"sum(rate({AFFINITY}{_sel(HIT)}[{RI}])) / sum(rate({AFFINITY}{_sel()}[{RI}]))",
                "hit rate",
            ),
        ),
        "percentunit",
        width=6,
        kind="stat",
        min=0,
        max=1,
    ),
    Panel(
        "Recoveries per minute",
        "Stranded turns recovered from the store (a dead, stalled or lost worker), by the state "
        "they were stranded in.",
        (Query(f"60 * {_rate('reins_recoveries_total', 'state', '')}", "{{state}}"),),
        "short",
        width=6,
    ),
    Panel(
        "Hand-backs per minute",
        "Turn messages a worker gave back unstarted: its drain grace ran out, or it cannot read "
        "a newer build's record (a rollout in the wrong order).",
        (Query(f"60 * {_rate('reins_handbacks_total', 'why', '')}", "{{why}}"),),
        "short",
        width=6,
    ),
    Panel(
        "Poison notices per minute",
        "Feed entries that did not decode, moved to the dead letters (reins doctor lists them).",
        (Query(f"60 * {_rate('reins_poison_notices_total', 'source', '')}", "{{source}}"),),
        "short",
        width=6,
    ),
    Panel(
        "Queue depth per worker",
        "Turn messages waiting in each worker's queue, at its last heartbeat.",
        (Query(f"sum by (worker) (reins_worker_queue_depth{_sel()})", "{{worker}}"),),
        "short",
        width=8,
    ),
    Panel(
        "Oldest queued turn per worker",
        "Time since the oldest turn waiting in each worker's queue was admitted.",
        (Query(f"max by (worker) (reins_worker_queue_oldest_age_seconds{_sel()})", "{{worker}}"),),
        "s",
        width=8,
    ),
    Panel(
        "Feed lag",
        "Feed entries not yet delivered to any router, and delivered but not yet acknowledged.",
        (
            Query(f"max by (source) (reins_feed_lag_entries{_sel()})", "{{source}} undelivered"),
            Query(f"max by (source) (reins_feed_pending_entries{_sel()})", "{{source}} pending"),
        ),
        "short",
        width=8,
    ),
    Panel(
        "Follow-on turns per second",
        "Turns a worker admitted and ran itself after the previous one, per worker.",
        (Query(_rate("reins_follow_on_turns_total", "worker", ""), "{{worker}}"),),
        "ops",
    ),
    Panel(
        "Redis errors per second",
        "Transient Redis errors (timeouts, refused connections), each failed attempt.",
        (Query(f"sum(rate(reins_redis_errors_total{_sel()}[{RI}]))", "errors"),),
        "ops",
    ),
)

#: The dashboard's rows, top to bottom: each a title and its panels.
ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Fairness", FAIRNESS),
    ("Fleet health", FLEET_HEALTH),
)
PANELS: tuple[Panel, ...] = FAIRNESS + FLEET_HEALTH


def _query_variable(name: str, label: str, metric: str, all_value: str) -> dict[str, Any]:
    """A multi-value variable listing ``name``'s values on ``metric``, All selected."""
    query = f"label_values({metric}, {name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "regex": "",
        "options": [],
        "hide": 0,
    }


#: A metric every reins process serves, unlabelled: where the namespaces and jobs are listed.
EVERY_PROCESS = "reins_store_conflicts_total"


def _variables() -> list[dict[str, Any]]:
    return [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "options": [],
        },
        _query_variable("namespace", "Namespace", EVERY_PROCESS, ".*"),
        _query_variable("job", "Job", f'{EVERY_PROCESS}{{namespace=~"$namespace"}}', ".*"),
        _query_variable("tenant", "Tenant", f"reins_tenant_weight{_sel()}", ".*"),
    ]


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    overrides: list[dict[str, Any]] = []
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
        options: dict[str, Any] = {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
        if len(panel.queries) > 1:  # reference series (e.g. weight share) are dashed
            overrides.append(
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "custom.fillOpacity", "value": 0},
                    ],
                }
            )
    else:
        defaults["thresholds"] = {
            "mode": "absolute",
            "steps": [
                {"color": "red", "value": None},
                {"color": "orange", "value": 0.8},
                {"color": "green", "value": 0.95},
            ],
        }
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    return {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": panel.width, "h": PANEL_HEIGHT},
        "fieldConfig": {"defaults": defaults, "overrides": overrides},
        "options": options,
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": q.expr,
                "legendFormat": q.legend,
                "range": True,
            }
            for i, q in enumerate(panel.queries)
        ],
    }


def _row(title: str, pid: int, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": GRID_WIDTH, "h": 1},
        "panels": [],
    }


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model: each row's title, then its panels."""
    panels: list[dict[str, Any]] = []
    pid, y = 0, 0
    for title, row in ROWS:
        pid += 1
        panels.append(_row(title, pid, y))
        x, y = 0, y + 1
        for panel in row:
            if x + panel.width > GRID_WIDTH:
                x, y = 0, y + PANEL_HEIGHT
            pid += 1
            panels.append(_panel(panel, pid, x, y))
            x += panel.width
        y += PANEL_HEIGHT
    return {
        "uid": UID,
        "title": "reins / fairness and fleet health",
        "description": "Per-tenant admission fairness, waits, stops and spend of a reins fleet, "
        "and its health: recoveries, hand-backs, queues, feed lag, affinity, Redis errors.",
        "tags": ["reins", "fairness", "fleet"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 2,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": _variables()},
        "panels": panels,
    }


def render() -> str:
    """The committed file's exact text."""
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def queries() -> list[tuple[str, str, str]]:
    """Every query as ``(panel title, refId, expr)``, with Grafana's variables unexpanded."""
    return [
        (p["title"], t["refId"], t["expr"]) for p in build()["panels"] for t in p.get("targets", ())
    ]


def write(paths: tuple[Path, ...] = (DASHBOARD_PATH, CHART_COPY)) -> tuple[Path, ...]:
    """Regenerate the committed JSON and the chart's copy; returns their paths."""
    text = render()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return paths


if __name__ == "__main__":  # pragma: no cover - `python -m ops.observability.dashboard`
    for written in write():
        sys.stdout.write(f"wrote {written}\n")
