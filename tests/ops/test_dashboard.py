"""The fairness dashboard: the committed JSON is what ops.observability.dashboard builds, and it is
sound."""

from __future__ import annotations

import json
import re

from ops.observability import dashboard
from ops.observability.metrics import Metrics

REQUIRED = (
    "Admitted-charge share per tenant",
    "Admissions per second",
    "Admission wait p99 per tenant",
    "READY queue depth",
    "Jain's fairness index",
    "Gate refusals per second",
    "Stops by reason",
    "Turn duration p99 per worker",
    "Spend rate",
    "Placement affinity hit rate",
    "Recoveries per minute",
    "Hand-backs per minute",
    "Poison notices per minute",
    "Queue depth per worker",
    "Oldest queued turn per worker",
    "Feed lag",
    "Redis errors per second",
)


def test_committed_json_and_chart_copy_are_the_generated_dashboard() -> None:
    generated = dashboard.render()
    for path in (dashboard.DASHBOARD_PATH, dashboard.CHART_COPY):
        assert path.read_text(encoding="utf-8") == generated, (
            f"{path} is stale: run `python -m ops.observability.dashboard`"
        )


def test_schema_variables_and_datasource() -> None:
    board = json.loads(dashboard.render())
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "job", "tenant"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["multi"] and variable["includeAll"]
        assert variable["datasource"]["uid"] == "${datasource}"
    # the job list follows the namespace, the tenant list both
    assert "$namespace" in variables["job"]["definition"]
    assert {"$namespace", "$job"} <= set(re.findall(r"\$\w+", variables["tenant"]["definition"]))
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])


def test_rows_hold_fairness_then_fleet_health() -> None:
    panels = json.loads(dashboard.render())["panels"]
    rows = [p["title"] for p in panels if p["type"] == "row"]
    assert rows == ["Fairness", "Fleet health"]
    after = {}
    row = ""
    for p in panels:
        row = p["title"] if p["type"] == "row" else row
        after[p["title"]] = row
    assert after["Jain's fairness index"] == "Fairness"
    assert after["Placement affinity hit rate"] == after["Feed lag"] == "Fleet health"


def test_required_panels_and_layout() -> None:
    panels = json.loads(dashboard.render())["panels"]
    titles = [p["title"] for p in panels]
    assert set(REQUIRED) <= set(titles)
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine


def test_every_metric_a_panel_reads_is_one_reins_exports() -> None:
    exported = set()
    for fam in Metrics(process_metrics=False).registry.collect():
        exported |= {fam.name, f"{fam.name}_total", f"{fam.name}_bucket"}
    for title, _, expr in dashboard.queries():
        names = set(re.findall(r"\breins_[a-z_]+", expr))
        assert names, title
        assert names <= exported, (title, names - exported)
    per_tenant = [e for t, _, e in dashboard.queries() if "tenant" in e and "$tenant" not in e]
    assert not per_tenant, "a per-tenant panel ignores the tenant variable"


def test_every_selector_of_every_query_names_the_deployment() -> None:
    """Two releases on one Prometheus: no query may read another namespace's or job's series."""
    for title, ref, expr in dashboard.queries():
        selectors = re.findall(r"\breins_[a-z_]+(\{[^}]*\})?", expr)
        assert selectors, title
        for sel in selectors:
            assert 'namespace=~"$namespace"' in sel and 'job=~"$job"' in sel, (title, ref, expr)
