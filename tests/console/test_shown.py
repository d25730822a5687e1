"""What the console's pages show, without a browser or Redis: durations, hold countdowns, the
list's filters (bad values named, never anything else raised), timeline lines, fair shares,
and what the support store's refund says it changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.console import share_chart, shown
from api.problems import Problem
from api.views import SharesAt, Spend, Trajectory, Usage, UsageHistory
from examples.support_store import agent
from kernel.chain import ChainRow, RowKind
from kernel.record import ControlKind
from kernel.states import LifecycleState, StopReason
from kernel.tools import Change


def trajectory(**change: object) -> Trajectory:
    base: dict[str, object] = {
        "trajectory_id": "traj-1",
        "state": "READY",
        "version": 1,
        "agent": "examples.support_store:agent",
        "user": "u",
        "goal": "g",
        "submitted_at": 1000.0,
        "stop_reason": None,
        "closing_message": None,
        "turn": 0,
        "budget": {"steps": Spend(allowance="8", spent="0", reserved="0")},
        "held_approval": None,
        "pending_control": None,
    }
    return Trajectory.model_validate({**base, **change})


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min 00 s"),
        (245, "4 min 05 s"),
        (3600, "1 h 00 min"),
        (11_220, "3 h 07 min"),
        (187_200, "2 d 4 h"),
        (-5, "0 s"),
    ],
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert shown.duration(seconds) == text


def test_a_moment_is_utc_to_the_second() -> None:
    assert shown.moment(1_796_154_506.9) == "2026-12-01 19:48:26 UTC"


@given(st.floats(0, 1e9), st.floats(-1e6, 1e6))
def test_a_hold_is_expired_exactly_when_its_time_is_up(now: float, delta: float) -> None:
    text = shown.time_left(now + delta, now)
    assert (text == "expired") is (now + delta <= now)
    assert text == "expired" or text.endswith(" left")


@given(
    st.dictionaries(
        st.sampled_from(["state", "stop_reason", "agent", "age", "x"]), st.text(max_size=20)
    )
)
def test_filters_parse_or_name_the_field_at_fault(query: dict[str, str]) -> None:
    try:
        filters = shown.Filters.of(query)
    except Problem as problem:
        assert problem.status == 422 and problem.field in query
        assert problem.detail.startswith(f"{problem.field}:")
        return
    assert "x" not in query
    assert filters.state is None or filters.state.value == query["state"]
    assert filters.age is None or filters.age in shown.AGES


def test_filters_keep_what_matches_every_one_set() -> None:
    done = trajectory(state="COMPLETED", stop_reason="done", submitted_at=1000.0)
    assert shown.Filters.of({"stop_reason": "done"}).keeps(done, 1000.0)
    assert not shown.Filters.of({"stop_reason": "killed"}).keeps(done, 1000.0)
    assert shown.Filters.of({"agent": "support"}).keeps(done, 1000.0)
    assert not shown.Filters.of({"agent": "billing"}).keeps(done, 1000.0)
    assert shown.Filters.of({"age": "15m"}).keeps(done, 1000.0 + 900)
    assert not shown.Filters.of({"age": "15m"}).keeps(done, 1000.0 + 901)
    assert shown.Filters.of({"state": "COMPLETED"}).state is LifecycleState.COMPLETED
    assert shown.Filters.of({"stop_reason": ""}).stop_reason is None


def row(kind: RowKind, **fields: object) -> ChainRow:
    base = {
        "trajectory_id": "t",
        "tenant": "a",
        "user": "u",
        "index": 3,
        "step": 2,
        "record_version": 4,
        "at": 5.0,
    }
    return ChainRow.model_validate({**base, "kind": kind, **fields})


def test_each_chain_row_is_one_timeline_line() -> None:
    model = shown.step_of(row(RowKind.MODEL, outcome="COMPLETED", tokens_in=10, tokens_out=2))
    assert (model.title, model.outcome) == ("model call, step 2", "COMPLETED")
    assert model.detail.startswith("10 tokens in, 2 out")
    tool = shown.step_of(row(RowKind.TOOL, tool="get_order", args={"order_id": "o1"}, outcome="ok"))
    assert tool.title == "get_order(order_id=o1)"
    approval = shown.step_of(
        row(
            RowKind.APPROVAL,
            tool="issue_refund",
            outcome="approved",
            detail={"reviewer": "ana", "comment": "fine"},
        )
    )
    assert approval.detail == "by ana: “fine”"
    control = shown.step_of(row(RowKind.CONTROL, outcome="pause", detail={"by": "ops"}))
    assert (control.title, control.outcome, control.detail) == ("control", "pause", "by ops")
    stop = shown.step_of(row(RowKind.STOP, outcome=StopReason.DONE.value))
    assert (stop.kind, stop.outcome, stop.index) == ("stop", "done", 3)


def test_controls_follow_the_scope_and_end_with_the_run() -> None:
    running, ended = trajectory(state="READY"), trajectory(state="CANCELED")
    assert shown.controls_for(running, may_control=False) == []
    assert [k for k, _ in shown.controls_for(running, True)] == [
        ControlKind.PAUSE,
        ControlKind.RESUME,
        ControlKind.CANCEL,
        ControlKind.KILL,
    ]
    assert all(on for _, on in shown.controls_for(running, True))
    assert not any(on for _, on in shown.controls_for(ended, True))


def usage(
    name: str, weight: float, ws: float, adm: float, backlog: int = 1, owed: float | None = None
) -> Usage:
    return Usage(
        tenant=name,
        weight=weight,
        weight_share=ws,
        admitted_share=adm,
        admissions=1,
        backlog=backlog,
        backlogged=backlog > 0,
        owed_share=owed,
        wait_p50_s=None,
        wait_p99_s=None,
    )


def test_shares_are_percent_and_the_heaviest_weight_first() -> None:
    rows = shown.shares([usage("b", 1, 0.25, 0.5), usage("a", 3, 0.75, 0.5)])
    assert [r.usage.tenant for r in rows] == ["a", "b"]
    assert rows[0].weight_pct == pytest.approx(75) and rows[0].gap_pct == pytest.approx(-25)


def test_the_gap_is_against_the_owed_share_and_none_with_nothing_queued() -> None:
    idle, busy = shown.shares(  # the heaviest weight first
        [usage("busy", 1, 0.25, 0.9, backlog=4, owed=1.0), usage("idle", 3, 0.75, 0.1, 0)]
    )
    assert busy.owed_pct == pytest.approx(100) and busy.gap_pct == pytest.approx(-10)
    assert idle.owed_pct is None and idle.gap_pct is None, "owed no share: no gap"


def test_the_share_chart_breaks_its_lines_where_nothing_was_admitted() -> None:
    spans = [
        SharesAt(start=0, end=1, admissions=2, contended=1.0, shares={"a": 0.75, "b": 0.25}),
        SharesAt(start=1, end=2, admissions=0, contended=None, shares={}),
        SharesAt(start=2, end=3, admissions=1, contended=0.0, shares={"a": 1.0, "b": 0.0}),
    ]
    drawn = share_chart.chart(
        UsageHistory(tenants=["b", "a"], buckets=spans), {"a": 0.75, "b": 0.25}
    )
    a, b = drawn.lines
    assert (a.tenant, b.tenant) == ("a", "b"), "the heaviest first"
    step = share_chart.WIDTH / 3
    top, half = share_chart.y_of(1.0), share_chart.y_of(0.5)
    assert (top, half, share_chart.y_of(0.0)) == (8.0, 100.0, 192.0)
    assert a.segments == (
        f"{round(step / 2, 1)},{share_chart.y_of(0.75)}",
        f"{round(step * 2.5, 1)},{top}",
    )
    assert a.shares == (0.75, None, 1.0) and b.shares == (0.25, None, 0.0)
    assert a.weight_y == share_chart.y_of(0.75) == 54.0
    assert drawn.contended == (1.0, None, 0.0) and drawn.left_out == 0
    many = UsageHistory(tenants=[f"t{i}" for i in range(10)], buckets=spans)
    assert share_chart.chart(many, {}).left_out == 10 - share_chart.LINES


def test_the_refund_says_what_it_changes_once_the_order_was_read() -> None:
    spec = agent.profile.catalog.get("issue_refund")
    assert spec is not None
    args = {"order_id": "ord_1", "amount_cents": 9000}
    assert spec.changes(args, {}) == []  # get_order not called: it cannot say
    facts = {"ord_1.refunded_cents": 1000, "ord_1.total_cents": 12_000}
    assert spec.changes(args, facts) == [
        Change("ord_1.refunded_cents", 1000, 10_000),
        Change("ord_1.refundable_cents", 11_000, 2000),
    ]
    read = agent.profile.catalog.get("get_order")
    assert read is not None and read.changes(args, facts) == []  # a read changes nothing
