"""The record's JSON from orjson is byte for byte its pydantic serializer's, and reads back.

:func:`kernel.modeljson.model_json` writes a record in C where pydantic-core would walk its
schema; every difference between the two libraries is either checked before writing or makes
orjson refuse, and then pydantic writes the value. These tests vary what a record can hold
(tool results, arguments, facts, observations, clock readings, money) and compare the bytes.
"""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer

from kernel.amounts import Amounts
from kernel.chain import ChainRow, RowKind
from kernel.events import DispatchTool
from kernel.fastmodel import construct, shallow_copy
from kernel.modeljson import _check_for, _never, json_native, model_json
from kernel.record import ControlKind, HeldProposal, PendingControl, TrajectoryRecord
from tests.kernel.driver import BIG_REFUND, PLAN, READ, Driver

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)  # beyond 64 bits too: orjson refuses
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)
objects = st.dictionaries(st.text(), json_values, max_size=4)
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
readings = st.floats(min_value=0, max_value=1e9) | st.integers(min_value=0, max_value=10**9)
money = st.decimals(min_value=0, allow_nan=False, allow_infinity=False) | st.sampled_from(
    [Decimal("0"), Decimal("0E-8"), Decimal("1.10"), Decimal("1E+3"), Decimal("-0")]
)


def pydantic_json(model: BaseModel) -> bytes:
    return model.__pydantic_serializer__.to_json(model)


def records() -> list[TrajectoryRecord]:
    """Records a run goes through: planned, waiting on a tool, held for approval, paused."""
    d = Driver()
    seen = [d.rec]
    d.reply(d.admit(), PLAN)
    seen.append(d.rec)
    d.reply(d.admit(), READ)
    seen.append(d.rec)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 4200})
    d.reply(d.admit(), BIG_REFUND)
    seen.append(d.rec)  # a held proposal
    paused = Driver()
    paused.reply(paused.admit(), PLAN)
    paused.control(ControlKind.PAUSE)
    seen.append(paused.rec)
    return seen


RECORDS = records()


@pytest.mark.parametrize("index", range(len(RECORDS)))
def test_a_kernel_record_is_written_as_pydantic_writes_it_and_reads_back(index: int) -> None:
    rec = RECORDS[index]
    data = model_json(rec)
    assert data == pydantic_json(rec) == rec.to_json()
    again = TrajectoryRecord.from_json(data)
    assert again == rec and again.to_json() == data


def test_every_model_a_record_or_a_row_holds_takes_the_fast_path() -> None:
    for cls in (TrajectoryRecord, ChainRow):
        assert _check_for(cls, set()) is not _never, cls.__name__
    for rec in RECORDS:
        assert _check_for(TrajectoryRecord, set())(rec)


@settings(max_examples=150, deadline=None)
@given(
    index=st.integers(min_value=0, max_value=len(RECORDS) - 1),
    evidence=objects,
    args=objects,
    facts=st.dictionaries(st.text(), scalars, max_size=4),
    observation=st.none() | objects,
    active=readings,
    wait=st.none() | readings,
    dollars=money,
)
def test_any_record_content_is_written_as_pydantic_writes_it(
    index: int,
    evidence: dict[str, Any],
    args: dict[str, Any],
    facts: dict[str, Any],
    observation: dict[str, Any] | None,
    active: float,
    wait: float | None,
    dollars: Decimal,
) -> None:
    rec = RECORDS[index].clone()
    rec.facts = facts
    rec.last_observation = observation
    rec.active_s = active  # an int here: pydantic writes 1.0, so orjson must not write it
    rec.wait_deadline = wait
    rec.operations = {k: shallow_copy(op) for k, op in rec.operations.items()}  # not shared
    for op in rec.operations.values():
        op.evidence, op.args = evidence, args
        op.reservation = Amounts.of(steps=1, dollars=dollars)
    data = model_json(rec)
    assert data == pydantic_json(rec)
    if all(isinstance(v, float) or v is None for v in (active, wait)):
        assert TrajectoryRecord.from_json(data).to_json() == data  # nothing was coerced


@settings(max_examples=100, deadline=None)
@given(at=readings, duration=readings, detail=st.none() | objects, args=st.none() | objects)
def test_any_chain_row_is_written_as_pydantic_writes_it(
    at: float, duration: float, detail: dict[str, Any] | None, args: dict[str, Any] | None
) -> None:
    row = construct(
        ChainRow,
        trajectory_id="t",
        tenant="acme",
        user="u",
        index=0,
        step=1,
        kind=RowKind.TOOL,
        record_version=2,
        at=at,
        duration_s=duration,
        detail=detail,
        args=args,
    )
    assert model_json(row) == pydantic_json(row)


def test_nested_float_fields_are_checked_too() -> None:
    rec = RECORDS[-2].clone()  # it holds a proposal: expires_at, held_at are floats
    assert rec.held is not None
    held = rec.held = shallow_copy(rec.held)
    held.held_at = 5  # type: ignore[assignment]  # an int, as a careless caller might set
    assert model_json(rec) == pydantic_json(rec)
    assert b'"held_at":5.0' in model_json(rec)
    control = construct(PendingControl, kind=ControlKind.PAUSE, request_id="r", requested_by="o")
    control.__dict__["at"] = 7
    rec.pending_control = control
    assert model_json(rec) == pydantic_json(rec)


def test_what_orjson_cannot_write_is_left_to_pydantic() -> None:
    rec = RECORDS[2].clone()
    odd: list[Any] = [{1, 2}, b"bytes", 2**80, {1: "a"}, (1, 2), Decimal("0.10")]
    for value in odd:
        rec.last_observation = {"value": value}
        assert model_json(rec) == pydantic_json(rec)


def test_a_model_of_an_unmarked_class_is_left_to_pydantic() -> None:
    class Plain(BaseModel):
        at: float = 1.0

    rec = RECORDS[0].clone()
    rec.last_observation = {"inner": Plain(at=2.0)}
    assert model_json(rec) == pydantic_json(rec)
    assert model_json(Plain()) == pydantic_json(Plain())


def test_marked_classes_still_behave_as_pydantic_models_and_as_dataclasses() -> None:
    held = HeldProposal(
        approval_id="a",
        held_version=2,
        plan_revision=1,
        expires_at=10.0,
        digest="d",
        tool="issue_refund",
        args={},
        call_key="k",
    )
    assert [f.name for f in dataclasses.fields(held)] == list(HeldProposal.model_fields)
    assert HeldProposal.model_validate_json(model_json(held)) == held
    assert json.loads(model_json(held)) == held.model_dump(mode="json")


def test_a_class_whose_json_pydantic_customises_cannot_be_marked() -> None:
    class Aliased(BaseModel):
        value: int = Field(0, alias="v")

    class Serialised(BaseModel):
        value: int = 0

        @field_serializer("value")
        def _double(self, value: int) -> int:
            return value * 2

    class Computed(BaseModel):
        value: int = 0

        @computed_field  # type: ignore[prop-decorator]
        @property
        def double(self) -> int:
            return self.value * 2

    class Extra(BaseModel):
        model_config = ConfigDict(extra="allow")

    class Floats(BaseModel):
        readings: list[float] = Field(default_factory=list)

    for cls in (Aliased, Serialised, Computed, Extra, Floats):
        with pytest.raises(TypeError, match="cannot be written by orjson"):
            json_native(cls)
