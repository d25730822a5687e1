"""ops.observability.metrics: names, labels, and the mapping from domain events to series."""

from __future__ import annotations

import math
import urllib.request
from decimal import Decimal

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kernel.chain import ChainRow, RowKind
from kernel.errors import ConcurrentModification, StoreUnavailable
from kernel.events import ReplyStatus
from kernel.record import TrajectoryRecord
from kernel.states import StopReason
from ops.observability.metrics import Metrics
from router.fleet.observe import provider_of
from router.placement.membership import MemberRecord
from tests.ops.workload import WEIGHTS, Workload, admission_config

FAMILIES = {
    # name as exposed (without _total/_bucket): (type, label names)
    "reins_admissions": ("counter", {"tenant", "provider"}),
    "reins_admitted_charge_tokens": ("counter", {"tenant"}),
    "reins_admission_wait_seconds": ("histogram", {"tenant"}),
    "reins_gate_refusals": ("counter", {"provider", "gate"}),
    "reins_ready_queue_depth": ("gauge", {"tenant"}),
    "reins_drr_credit_tokens": ("gauge", {"tenant"}),
    "reins_tenant_weight": ("gauge", {"tenant"}),
    "reins_fairness_jain_index": ("gauge", set()),
    "reins_turn_duration_seconds": ("histogram", {"worker"}),
    "reins_model_calls": ("counter", {"provider", "status"}),
    "reins_tool_calls": ("counter", {"tool", "outcome"}),
    "reins_compactions": ("counter", {"tenant"}),
    "reins_memory_recalls": ("counter", {"tenant", "outcome"}),
    "reins_memory_embedding_fallbacks": ("counter", {"tenant"}),
    "reins_trajectory_stops": ("counter", {"tenant", "stop_reason"}),
    "reins_budget_cutoffs": ("counter", {"tenant", "limit"}),
    "reins_spend_dollars": ("counter", {"tenant"}),
    "reins_approvals_held": ("gauge", {"tenant"}),
    "reins_owed_runs": ("gauge", {"tenant"}),
    "reins_store_conflicts": ("counter", set()),
    "reins_ring_members": ("gauge", {"state"}),
    "reins_poison_notices": ("counter", {"source"}),
    "reins_recoveries": ("counter", {"state"}),
    "reins_handbacks": ("counter", {"worker", "why"}),
    "reins_follow_on_turns": ("counter", {"worker"}),
    "reins_turn_affinity": ("counter", {"worker", "placement"}),
    "reins_worker_queue_depth": ("gauge", {"worker"}),
    "reins_worker_queue_oldest_age_seconds": ("gauge", {"worker"}),
    "reins_feed_lag_entries": ("gauge", {"source"}),
    "reins_feed_pending_entries": ("gauge", {"source"}),
    "reins_worker_info": ("gauge", {"worker", "member"}),
    "reins_redis_errors": ("counter", set()),
}


def value(m: Metrics, name: str, **labels: str) -> float:
    """One sample's value; 0 if the series does not exist."""
    got = m.registry.get_sample_value(name, labels)
    return 0.0 if got is None else got


def series(m: Metrics) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in m.registry.collect()
        if fam.name.startswith("reins_")
        for s in fam.samples
    }


def test_each_metrics_object_has_its_own_registry_and_nothing_global() -> None:
    before = {fam.name for fam in REGISTRY.collect()}
    a, b = Metrics(), Metrics()
    a.on_admitted("acme", "openai", 100, 0.5)
    assert value(a, "reins_admissions_total", tenant="acme", provider="openai") == 1
    assert value(b, "reins_admissions_total", tenant="acme", provider="openai") == 0
    assert not any(n.startswith("reins") for n in {f.name for f in REGISTRY.collect()} - before)
    shared = CollectorRegistry()
    assert Metrics(shared, process_metrics=False).registry is shared


def test_names_types_and_labels() -> None:
    m = Metrics()
    fams = {f.name: f for f in m.registry.collect() if f.name.startswith("reins_")}
    assert {n: (f.type, set(FAMILIES[n][1])) for n, f in fams.items()} == {
        n: (t, labels) for n, (t, labels) in FAMILIES.items()
    }
    text = m.render().decode()
    exposed = {f.name for f in text_string_to_metric_families(text)}
    assert "reins_admissions" in exposed and "process_cpu_seconds" in exposed
    for name, (kind, labels) in FAMILIES.items():
        assert not labels & {"trajectory", "trajectory_id", "call_id", "user"}, name
        if kind == "counter":
            assert f"# TYPE {name}_total counter" in text or f"# TYPE {name} counter" in text


def test_admissions_charge_wait_and_gate_refusals() -> None:
    m = Metrics()
    m.on_config(admission_config())
    m.on_admitted("acme", "openai", 9000, 0.3)
    m.on_admitted("acme", "", 1000, 12.0)
    m.on_gate_refused("openai", "tpm")
    assert value(m, "reins_admissions_total", tenant="acme", provider="openai") == 1
    assert value(m, "reins_admissions_total", tenant="acme", provider="none") == 1
    assert value(m, "reins_admitted_charge_tokens_total", tenant="acme") == 10000
    assert value(m, "reins_admission_wait_seconds_count", tenant="acme") == 2
    assert value(m, "reins_admission_wait_seconds_bucket", tenant="acme", le="0.5") == 1
    assert value(m, "reins_admission_wait_seconds_sum", tenant="acme") == pytest.approx(12.3)
    assert value(m, "reins_gate_refusals_total", provider="openai", gate="tpm") == 1
    assert provider_of("anthropic/claude-haiku") == "anthropic"
    assert provider_of("") == "none"


def test_config_declares_tenants_from_zero_and_drops_the_gone() -> None:
    m = Metrics()
    m.on_config(admission_config())
    for tenant, weight in WEIGHTS.items():
        assert value(m, "reins_tenant_weight", tenant=tenant) == weight
        for reason in StopReason:
            key = {"tenant": tenant, "stop_reason": reason.value}
            assert m.registry.get_sample_value("reins_trajectory_stops_total", key) == 0
        assert m.registry.get_sample_value("reins_spend_dollars_total", {"tenant": tenant}) == 0
    smaller = admission_config().model_copy(update={"tenants": admission_config().tenants[:1]})
    m.on_owed_runs({"acme": 2, "globex": 1})
    assert value(m, "reins_owed_runs", tenant="acme") == 2
    m.on_config(smaller)
    assert m.registry.get_sample_value("reins_tenant_weight", {"tenant": "globex"}) is None
    assert m.registry.get_sample_value("reins_owed_runs", {"tenant": "globex"}) is None
    assert value(m, "reins_tenant_weight", tenant="acme") == 3


def test_poison_is_counted_per_source_of_a_closed_list() -> None:
    m = Metrics()
    assert value(m, "reins_poison_notices_total", source="notices") == 0
    assert m.registry.get_sample_value("reins_poison_notices_total", {"source": "handbacks"}) == 0
    m.on_poison("notices", 2)
    m.on_poison("handbacks", 1)
    m.on_poison("somewhere", 5)  # not a source of the feed: logged, not counted
    assert value(m, "reins_poison_notices_total", source="notices") == 2
    assert value(m, "reins_poison_notices_total", source="handbacks") == 1
    sources = {
        s.labels["source"]
        for fam in m.registry.collect()
        for s in fam.samples
        if s.name == "reins_poison_notices_total"
    }
    assert sources == {"notices", "handbacks"}


def test_figures_set_the_admitter_gauges_and_forget_clears_them() -> None:
    m = Metrics()
    w = Workload(m)
    w.admit(300)
    figures = w.admitter.figures()
    for t in figures.tenants:
        assert value(m, "reins_ready_queue_depth", tenant=t.tenant) == t.queue_depth > 0
        assert value(m, "reins_drr_credit_tokens", tenant=t.tenant) == t.credit
    assert value(m, "reins_fairness_jain_index") == pytest.approx(figures.jain_index)
    m.forget_figures()
    assert m.registry.get_sample_value("reins_ready_queue_depth", {"tenant": "acme"}) is None
    assert math.isnan(value(m, "reins_fairness_jain_index"))


def test_commits_count_models_tools_stops_and_spend_from_the_chain() -> None:
    m = Metrics()
    w = Workload(m)
    w.turns(4)  # two complete (done), two hit max_steps
    assert value(m, "reins_trajectory_stops_total", tenant="globex", stop_reason="done") == 1
    assert value(m, "reins_trajectory_stops_total", tenant="acme", stop_reason="done") == 1
    assert value(m, "reins_trajectory_stops_total", tenant="initech", stop_reason="max_steps") == 1
    stops = sum(v for (n, _), v in _samples(m) if n == "reins_trajectory_stops_total")
    assert stops == 4
    # the cut-off rate's numerator: the two budget stops (max_steps), each under its tenant
    cutoffs = {k: v for (n, k), v in _samples(m) if n == "reins_budget_cutoffs_total" and v}
    assert cutoffs == {
        (("limit", "max_steps"), ("tenant", "globex")): 1,
        (("limit", "max_steps"), ("tenant", "initech")): 1,
    }
    completed = value(m, "reins_model_calls_total", provider="scripted", status="COMPLETED")
    assert completed > 4
    assert value(m, "reins_tool_calls_total", tool="issue_refund", outcome="ok") == 2
    assert value(m, "reins_store_conflicts_total") == 1


def test_spend_is_the_settled_dollars_a_commit_adds() -> None:
    m = Metrics()
    before = _record()
    after = before.model_copy(deep=True)
    after.ledger.dollars.actual += Decimal("0.125")
    m.on_commit(before, after, [], "openai")
    m.on_commit(after, after, [], "openai")  # nothing settled
    assert value(m, "reins_spend_dollars_total", tenant="acme") == pytest.approx(0.125)


def test_odd_values_are_bounded_and_never_raise() -> None:
    m = Metrics()
    rec = _record()
    rows = [
        _row(rec, 0, RowKind.MODEL, outcome="SOMETHING_NEW"),
        _row(rec, 1, RowKind.MODEL, outcome=ReplyStatus.TRUNCATED.value),
        _row(rec, 2, RowKind.TOOL, tool="refund", outcome="weird"),
        _row(rec, 3, RowKind.TOOL, tool="refund", outcome="progress"),
        _row(rec, 4, RowKind.STOP, outcome="not_a_reason"),
    ]
    m.on_commit(rec, rec, rows, "openai")
    assert value(m, "reins_model_calls_total", provider="openai", status="other") == 1
    assert value(m, "reins_model_calls_total", provider="openai", status="TRUNCATED") == 1
    assert value(m, "reins_tool_calls_total", tool="refund", outcome="other") == 1
    assert value(m, "reins_tool_calls_total", tool="refund", outcome="progress") == 0
    assert not [s for s in _samples(m) if s[0][0] == "reins_trajectory_stops_total"]


def test_metered_commit_counts_only_what_was_committed() -> None:
    m = Metrics()
    rec = _record()
    rows = [_row(rec, 0, RowKind.STOP, outcome="done")]

    def unavailable(*_: object) -> None:
        raise StoreUnavailable("down")

    def lost(*_: object) -> None:
        raise ConcurrentModification("t1", 1, 2)

    with pytest.raises(StoreUnavailable):
        m.metered_commit(unavailable)(rec, rec, rows)
    with pytest.raises(ConcurrentModification):
        m.metered_commit(lost)(rec, rec, rows)
    assert value(m, "reins_store_conflicts_total") == 1
    assert value(m, "reins_trajectory_stops_total", tenant="acme", stop_reason="done") == 0
    m.metered_commit(lambda *_: None)(rec, rec, rows)
    assert value(m, "reins_trajectory_stops_total", tenant="acme", stop_reason="done") == 1


def test_turns_and_membership() -> None:
    m = Metrics()
    m.on_turn("worker-0", 0.7)
    with m.turn_timer("worker-1"):
        pass
    assert value(m, "reins_turn_duration_seconds_count", worker="worker-0") == 1
    assert value(m, "reins_turn_duration_seconds_count", worker="worker-1") == 1
    m.on_membership(
        [
            MemberRecord("a", 1.0, 0.0, draining=False, live=True),
            MemberRecord("b", 1.0, 0.0, draining=True, live=True),
            MemberRecord("c", 1.0, 0.0, draining=True, live=False),
        ]
    )
    assert [value(m, "reins_ring_members", state=s) for s in ("active", "draining", "lapsed")] == [
        1,
        1,
        1,
    ]


def test_series_do_not_grow_with_trajectories() -> None:
    m = Metrics()
    w = Workload(m)
    w.chunk(admissions=200, runs=6)
    first = series(m)
    w.chunk(admissions=2000, runs=30)
    assert series(m) == first


def test_serves_metrics_over_http_on_loopback() -> None:
    m = Metrics()
    m.on_admitted("acme", "openai", 10, 0.1)
    server = m.serve("127.0.0.1", 0)
    try:
        with urllib.request.urlopen(server.url, timeout=10) as r:
            body = r.read().decode()
        assert 'reins_admissions_total{provider="openai",tenant="acme"} 1.0' in body
    finally:
        server.close()


def _samples(m: Metrics) -> list[tuple[tuple[str, tuple[tuple[str, str], ...]], float]]:
    return [
        ((s.name, tuple(sorted(s.labels.items()))), s.value)
        for fam in m.registry.collect()
        for s in fam.samples
    ]


def _record() -> TrajectoryRecord:
    from kernel.budget import Budget

    return TrajectoryRecord.create(
        trajectory_id="t1", tenant="acme", user="u", goal="g", agent="a", budget=Budget(), now=0.0
    )


def _row(rec: TrajectoryRecord, index: int, kind: RowKind, **fields: object) -> ChainRow:
    return ChainRow(
        trajectory_id=rec.trajectory_id,
        tenant=rec.tenant,
        user=rec.user,
        index=index,
        step=0,
        kind=kind,
        record_version=rec.record_version,
        at=0.0,
        **fields,
    )


def test_a_compaction_is_counted_apart_from_the_steps_model_calls() -> None:
    m = Metrics()
    rec = _record()
    rows = [
        _row(rec, 0, RowKind.MODEL, outcome="COMPLETED"),
        _row(rec, 1, RowKind.MODEL, outcome="COMPLETED", detail={"purpose": "compaction"}),
    ]
    m.on_commit(rec, rec, rows, "openai")
    assert value(m, "reins_model_calls_total", provider="openai", status="COMPLETED") == 2
    assert value(m, "reins_compactions_total", tenant="acme") == 1


def test_recalls_are_counted_as_hits_and_misses() -> None:
    m = Metrics()
    m.on_recall("acme", True)
    m.on_recall("acme", False)
    m.on_recall("acme", True)
    assert value(m, "reins_memory_recalls_total", tenant="acme", outcome="hit") == 2
    assert value(m, "reins_memory_recalls_total", tenant="acme", outcome="miss") == 1
    m.on_embedding_fallback("acme")
    assert value(m, "reins_memory_embedding_fallbacks_total", tenant="acme") == 1
