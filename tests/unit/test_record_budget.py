"""The record's JSON round trip, schema versions, and budget validation."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from kernel.amounts import Amounts, ModelPrice, Usage, model_call_charge
from kernel.budget import Budget
from kernel.errors import InvalidBudget, UnsupportedSchema
from kernel.record import (
    SCHEMA_VERSION,
    HeldProposal,
    HoldReason,
    Operation,
    OpKind,
    PlanStep,
    StepStatus,
    TrajectoryRecord,
)


def busy_record() -> TrajectoryRecord:
    rec = TrajectoryRecord.create(
        trajectory_id="t1",
        tenant="acme",
        user="cu_ana",
        goal="refund ord_1001",
        agent="m:a",
        budget=Budget.build(max_cost=Decimal("2.50"), reserve=Amounts(dollars=Decimal("0.25"))),
        now=12.5,
        parent_id="t0",
    )
    rec.plan = [
        PlanStep(id="s1", tool="get_order"),
        PlanStep(id="s2", tool="issue_refund", depends_on=["s1"], status=StepStatus.DONE),
    ]
    rec.facts = {"ord_1001.total_cents": 4200, "ord_1001.sent": True, "x": 0.1, "y": None}
    rec.last_observation = {"status": "ok", "items": [1, 2, {"a": "b"}]}
    price = ModelPrice(
        input_per_m=Decimal(3), cached_input_per_m=Decimal("0.3"), output_per_m=Decimal(15)
    )
    rec.ledger.admit("op1", Amounts(steps=1, tokens=500, dollars=Decimal("0.0105")))
    rec.ledger.settle(
        "op1", model_call_charge(price, Usage(uncached_input=100, cached_input=50, output=7))
    )
    rec.ledger.admit("op2", Amounts(tool_calls=1, dollars=Decimal("0.10")))
    rec.operations["op2"] = Operation(
        op_id="op2",
        call_id="c2",
        kind=OpKind.TOOL,
        attempts=["a1"],
        idempotency_key="t1:s2",
        epoch=0,
        reservation=Amounts(tool_calls=1, dollars=Decimal("0.10")),
        tool="issue_refund",
        args={"order_id": "ord_1001", "amount_cents": 3000},
    )
    rec.held = HeldProposal(
        approval_id="ap1",
        held_version=3,
        plan_revision=1,
        expires_at=99.0,
        digest="abc",
        tool="issue_refund",
        args={"amount_cents": 8000},
        call_key="t1:s2",
    )
    rec.seen = {"fp": 2}
    return rec


def test_json_round_trip_is_exact() -> None:
    rec = busy_record()
    data = rec.to_json()
    back = TrajectoryRecord.from_json(data)
    assert back == rec
    assert back.to_json() == data
    assert isinstance(back.ledger.dollars.actual, Decimal)
    assert json.loads(data)["schema_version"] == SCHEMA_VERSION == 8


def test_unknown_schema_version_is_refused() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(UnsupportedSchema, match=rf"t1.*schema version {SCHEMA_VERSION + 1}"):
        TrajectoryRecord.from_json(json.dumps(raw))


def test_a_version_1_record_reads_as_this_version_with_no_overrun() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = 1
    del raw["ledger"]["overrun"]  # version 1 had none
    del raw["scratchpad"]  # nor a scratchpad
    del raw["service_class"]  # nor a class
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == SCHEMA_VERSION and back.ledger.overrun == Amounts()
    assert back.scratchpad is None and back.service_class is None
    assert json.loads(back.to_json())["ledger"]["overrun"]["tokens"] == 0


def test_a_version_2_record_reads_with_the_tenants_first_class_and_keeps_a_class_set() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = 2
    del raw["service_class"]  # version 2 had none
    del raw["scratchpad"]
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == SCHEMA_VERSION and back.service_class is None
    assert json.loads(back.to_json())["service_class"] is None
    raw = json.loads(busy_record().to_json())
    raw["service_class"] = "maintenance"
    kept = TrajectoryRecord.from_json(json.dumps(raw))
    assert kept.service_class == "maintenance"
    assert TrajectoryRecord.from_json(kept.to_json()) == kept


def test_a_version_3_record_reads_with_its_scratchpad_and_no_class() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = 3
    del raw["service_class"]  # version 3 had the scratchpad, not the class
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == SCHEMA_VERSION and back.service_class is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"max_steps": -1}, "max_steps"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"max_cost": Decimal("-0.01")}, "max_cost"),
        ({"max_cost": Decimal("1"), "reserve": Amounts(dollars=Decimal("1"))}, "reserve.dollars"),
        ({"max_steps": 3, "reserve": Amounts(steps=5)}, "reserve.steps"),
        ({"max_tokens": 100, "max_output_tokens": 300}, "max_output_tokens"),
    ],
)
def test_invalid_budgets_name_the_field(values: dict, field: str) -> None:
    with pytest.raises(InvalidBudget, match=field.replace(".", r"\.")):
        Budget.build(**values)


def test_overrides() -> None:
    b = Budget().with_overrides(["max_steps=3", "max_cost=0.5", "reserve.dollars=0.1"])
    assert (b.max_steps, b.max_cost, b.reserve.dollars) == (3, Decimal("0.5"), Decimal("0.1"))
    with pytest.raises(InvalidBudget, match="unknown budget key 'max_stepz'"):
        Budget().with_overrides(["max_stepz=3"])
    with pytest.raises(InvalidBudget, match="key=value"):
        Budget().with_overrides(["max_steps"])


def test_a_version_4_record_reads_with_no_recoveries() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = 4
    del raw["recoveries"]
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == SCHEMA_VERSION and back.recoveries == 0


def test_a_version_5_record_reads_unfrozen_and_its_hold_for_a_reviewer() -> None:
    raw = json.loads(busy_record().to_json())
    raw["schema_version"] = 5
    del raw["grants"]["frozen"]
    raw["held"] = {
        "approval_id": "t1/ap1", "held_version": 3, "plan_revision": 1, "expires_at": 9.0,
        "digest": "d", "tool": "issue_refund", "args": {}, "call_key": "k",
    }  # fmt: skip
    back = TrajectoryRecord.from_json(json.dumps(raw))
    assert back.schema_version == SCHEMA_VERSION and not back.grants.frozen
    assert back.held is not None and back.held.reason is HoldReason.APPROVAL
