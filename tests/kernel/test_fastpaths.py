"""The kernel's fast paths give exactly what the general ones give.

Each shortcut taken for the benchmark's sake (encoders built once, enum values read as plain
attributes, a settlement that skips the figure nobody reads, accounts shared until written,
one plan step copied, the scripted model's parser) is checked against the plain library or
the slow path it replaces.
"""

from __future__ import annotations

import json
import pickle
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernel.amounts import ZERO, Amounts, Dimension, Usage, tool_call_charge, tool_call_liability
from kernel.budget import Budget
from kernel.chain import RowKind
from kernel.events import DispatchTool, ModelReplied, ReplyStatus
from kernel.fastmodel import construct
from kernel.jsontext import canonical_text, plain_text, sorted_text
from kernel.ledger import Ledger
from kernel.lifecycle import Cause
from kernel.record import (
    ApprovalStatus,
    ControlKind,
    ErrorStreak,
    Grants,
    OpKind,
    OpStatus,
    PlanStep,
    StepStatus,
    TrajectoryRecord,
)
from kernel.render import estimate_tokens
from kernel.states import LifecycleState, StopReason
from tests.kernel.driver import PLAN, READ, Driver
from worker.models import ModelReply, ScriptedModel, parse_view

PINNED = [
    LifecycleState,
    StopReason,
    RowKind,
    StepStatus,
    OpKind,
    OpStatus,
    ApprovalStatus,
    ControlKind,
    Dimension,
    Cause,
    ReplyStatus,
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_the_encoders_built_once_give_the_text_json_dumps_gives(value: Any) -> None:
    assert sorted_text(value) == json.dumps(value, sort_keys=True)
    assert plain_text(value) == json.dumps(value)
    assert canonical_text(value) == json.dumps(
        value, sort_keys=True, separators=(",", ":"), default=str
    )


def test_the_encoders_refuse_what_json_dumps_refuses_and_digest_what_it_digests() -> None:
    with pytest.raises(TypeError):
        sorted_text({"a": object()})
    with pytest.raises(TypeError):
        sorted_text({1: "a", "b": 2})  # keys that do not sort
    odd = {"state": LifecycleState.READY, "dollars": Decimal("1.10"), "at": (1, 2)}
    assert canonical_text(odd) == json.dumps(
        odd, sort_keys=True, separators=(",", ":"), default=str
    )


@pytest.mark.parametrize("enum", PINNED, ids=lambda e: e.__name__)
def test_pinned_enum_values_read_as_before(enum: Any) -> None:
    for member in enum:
        assert member.value == member._value_ and type(member.value) is str
        assert enum(member.value) is member
        assert pickle.loads(pickle.dumps(member)) is member
        assert json.dumps(member) == json.dumps(member._value_)


@given(json_values)
def test_the_scripted_model_parses_a_view_as_json_loads_does(value: Any) -> None:
    text = json.dumps(value)
    assert repr(parse_view(text)) == repr(json.loads(text))


def test_a_view_the_fast_parser_refuses_still_parses() -> None:
    text = json.dumps({"fact": "\ud800"})  # a lone surrogate, escaped
    assert parse_view(text) == json.loads(text) == {"fact": "\ud800"}
    with pytest.raises(ValueError):
        parse_view("{not json")


def test_booking_settles_exactly_as_settle_does() -> None:
    budget = Budget(max_cost=Decimal("1.00"))
    liability = Amounts(steps=1, tokens=600, dollars=Decimal("0.00462"))
    usage = Amounts(steps=1, tokens=420, dollars=Decimal("0E-8"))
    for final in (True, False):
        settled, booked = Ledger.open(budget), Ledger.open(budget)
        for ledger in (settled, booked):
            ledger.admit("op", liability)
        released = settled.settle("op", usage, final=final)
        booked.book("op", usage, final=final)
        assert booked.model_dump_json() == settled.model_dump_json()
        expected = Amounts(steps=0, tokens=180, dollars=Decimal("0.00462"))
        assert released == (expected if final else Amounts())


def test_a_ledger_copy_shares_its_accounts_until_a_write_replaces_one() -> None:
    ledger = Ledger.open(Budget())
    before = ledger.model_dump_json()
    copy = ledger.clone()
    copy.admit("call", Amounts(steps=1, tokens=300, dollars=Decimal("0.003")))
    assert ledger.model_dump_json() == before
    assert copy.tool_calls is ledger.tool_calls  # untouched: still shared
    assert copy.steps is not ledger.steps and copy.steps.reserved == 1
    copy.book("call", Amounts(steps=1, tokens=200, dollars=Decimal("0.002")))
    assert ledger.model_dump_json() == before
    assert copy.tool_calls is ledger.tool_calls


def test_a_free_tool_call_shares_one_value() -> None:
    assert tool_call_liability(ZERO) is tool_call_charge(ZERO)
    assert tool_call_liability(ZERO) == Amounts(tool_calls=1, dollars=Decimal(0))
    priced = tool_call_liability(Decimal("0.00"))
    assert priced == Amounts(tool_calls=1) and str(priced.dollars) == "0.00"


def test_a_result_copies_only_the_plan_step_it_changes() -> None:
    d = Driver()
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), READ)
    before = d.rec
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 4200})
    (done, *rest), (old, *old_rest) = d.rec.plan, before.plan
    assert done.status is StepStatus.DONE and old.status is StepStatus.PENDING
    assert all(new is same for new, same in zip(rest, old_rest, strict=True))


def test_a_kernel_model_still_refuses_a_name_that_is_not_a_field() -> None:
    step = PlanStep(id="s1", tool="get_order")
    step.status = StepStatus.DONE
    assert step.status is StepStatus.DONE
    with pytest.raises(ValueError, match="no field"):
        step.stauts = StepStatus.FAILED  # type: ignore[attr-defined]


def test_a_record_created_without_validation_is_the_validated_one() -> None:
    budget = Budget()
    fields: dict[str, Any] = {
        "trajectory_id": "t1",
        "tenant": "acme",
        "user": "u",
        "goal": "g",
        "agent": "a",
        "budget": budget,
    }
    fast = TrajectoryRecord.create(**fields, now=1.5, grants=Grants(read_only=True))
    slow = TrajectoryRecord(
        **fields,
        ledger=Ledger.open(budget),
        submitted_at=1.5,
        grants=Grants(read_only=True),
    )
    assert fast == slow and fast.to_json() == slow.to_json()
    assert list(fast.__dict__) == list(slow.__dict__)  # the declared order
    other = TrajectoryRecord.create(**fields, now=1.5)
    for name in ("plan", "facts", "seen", "operations", "job_logs"):
        assert getattr(other, name) is not getattr(fast, name)  # never one shared default
    coerced = TrajectoryRecord.create(**fields, now=2)  # an int: validated, so coerced
    assert type(coerced.submitted_at) is float
    with pytest.raises(ValueError):
        TrajectoryRecord.create(**{**fields, "goal": None}, now=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("latency", [1.5, 2, 0.0])
def test_a_scripted_reply_and_its_event_are_the_validated_ones(latency: float) -> None:
    model = ScriptedModel(lambda view, i: ({"type": "final", "outcome": "completed"}, latency))
    view, raw = json.dumps({"goal": "g"}), json.dumps({"type": "final", "outcome": "completed"})
    reply = model.call(view, 300, 30.0)
    expected = ModelReply(
        status=ReplyStatus.COMPLETED,
        content={"type": "final", "outcome": "completed"},
        raw=raw,
        usage=Usage(uncached_input=estimate_tokens(view), output=estimate_tokens(raw)),
        latency_s=latency,
    )
    assert reply == expected and type(reply.latency_s) is float
    for now in (3.0, 3):
        event = reply.replied("t1/m1", now)
        validated = ModelReplied(
            now=now,
            call_id="t1/m1",
            status=reply.status,
            content=reply.content,
            raw=reply.raw,
            usage=reply.usage,
            latency_s=reply.latency_s,
        )
        assert event == validated and type(event.now) is float


def test_a_reply_with_a_negative_latency_is_still_refused_as_an_event() -> None:
    reply = ModelReply(status=ReplyStatus.COMPLETED, latency_s=-1.0)
    with pytest.raises(ValueError):
        reply.replied("t1/m1", 1.0)


def test_a_constructed_model_gets_its_own_value_from_each_default_factory() -> None:
    first, second = construct(Grants), construct(Grants)
    first.denied_targets.append("ord_1")
    assert second.denied_targets == [] and second == Grants()
    a, b = Ledger.open(Budget()), Ledger.open(Budget())
    assert a.reservations is not b.reservations and a == b
    base = TrajectoryRecord.create(
        trajectory_id="t", tenant="acme", user="u", goal="g", agent="a", budget=Budget(), now=0.0
    )
    required = {
        n: getattr(base, n) for n, f in TrajectoryRecord.model_fields.items() if f.is_required()
    }
    one, two = construct(TrajectoryRecord, **required), construct(TrajectoryRecord, **required)
    assert one.error_streak == ErrorStreak()  # a model as factory: a fresh one of its defaults
    assert one.error_streak is not two.error_streak and one.facts is not two.facts
    given_value = ["x"]
    assert construct(Grants, denied_targets=given_value).denied_targets is given_value
