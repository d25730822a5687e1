"""The fairness dashboard: the committed JSON is what ops.dashboard builds, and it is sound."""

from __future__ import annotations

import json
import re

from ops import dashboard
from ops.metrics import Metrics

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
)


def test_committed_json_and_chart_copy_are_the_generated_dashboard() -> None:
    generated = dashboard.render()
    for path in (dashboard.DASHBOARD_PATH, dashboard.CHART_COPY):
        assert path.read_text(encoding="utf-8") == generated, (
            f"{path} is stale: run `python -m ops.dashboard`"
        )


def test_schema_variables_and_datasource() -> None:
    board = json.loads(dashboard.render())
    assert board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    tenant = variables["tenant"]
    assert tenant["type"] == "query" and tenant["multi"] and tenant["includeAll"]
    assert tenant["datasource"]["uid"] == "${datasource}"
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])


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
