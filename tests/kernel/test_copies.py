"""What the step function's cheap copy shares, and the bytes a committed record is stored as.

A step copies only what it may change and shares the rest with its input (``clone``); each
test drives a path that changes something shared, and checks the input's bytes after every
step. The stored snapshot and chain rows must read back to the very bytes that were written.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import RefundPolicy
from kernel.agent import Escalation
from kernel.budget import Budget
from kernel.chain import ChainRow
from kernel.context import KernelContext, StepResult
from kernel.events import Admit, CallModel, DispatchTool, Event, ReplyStatus, ToolProgress
from kernel.record import ControlKind, OpStatus, StepStatus, TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from store.in_process import InProcessStore
from tests.kernel.driver import PLAN, READ, Driver
from tests.kernel.harness import new_record
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel

S = LifecycleState


class CheckedDriver(Driver):
    """A driver that checks, after every step, that the step left its input unchanged."""

    def apply(self, event: Event) -> StepResult:
        before, data = self.rec, self.rec.to_json()
        result = super().apply(event)
        assert before.to_json() == data, f"the step changed its input on {event.type}"
        return result


def test_a_late_result_for_a_handed_off_call_leaves_the_input_unchanged() -> None:
    d = CheckedDriver()
    dispatch = d.to_reading()
    d.control(ControlKind.INTERRUPT, instructions="never mind")  # the read goes on, unwatched
    d.control(ControlKind.CANCEL, rid="c2")  # between turns: the read passes to the reconciler
    handed_off = d.rec.operations[dispatch.call_id]
    assert handed_off.status is OpStatus.HANDED_OFF and not handed_off.eligible
    d.result(dispatch, {"status": "ok", "total_cents": 4200})  # late evidence settles it
    assert d.rec.operations[dispatch.call_id].status is OpStatus.SETTLED
    assert handed_off.status is OpStatus.HANDED_OFF and handed_off.evidence is None


def test_plan_statuses_change_on_a_copy_of_the_plan() -> None:
    d = CheckedDriver()
    d.reply(d.admit(), PLAN)
    planned = d.rec
    d.reply(d.admit(), READ)
    d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": 4200})
    assert d.rec.plan[0].status is StepStatus.DONE
    assert planned.plan[0].status is StepStatus.PENDING


def test_error_streaks_are_replaced_not_changed() -> None:
    d = CheckedDriver()
    for _ in range(2):
        d.reply(d.admit(), "not a proposal")
    assert (d.rec.error_streak.kind, d.rec.error_streak.count) == ("malformed_reply", 2)
    d.reply(d.admit(), PLAN)
    assert (d.rec.error_streak.kind, d.rec.error_streak.count) == (None, 0)
    assert d.history[-3].record.error_streak.count == 2


def test_job_logs_are_replaced_not_changed() -> None:
    d = CheckedDriver()
    dispatch = d.to_reading()
    for line in ("10%", "50%"):
        d.apply(ToolProgress(now=d.now, call_id=dispatch.call_id, line=line))
    assert d.rec.job_logs[dispatch.call_id] == ["10%", "50%"]
    assert d.history[-2].record.job_logs[dispatch.call_id] == ["10%"]


def test_restricting_grants_replaces_them() -> None:
    d = CheckedDriver(
        Budget(
            max_steps=50,
            max_tool_calls=50,
            max_tokens=1_000_000,
            deadline_s=1000,
            max_cost=Decimal("0.0200"),
            max_stalls=50,
        )
    )
    d.ctx = dataclasses.replace(
        d.ctx,
        agent=dataclasses.replace(
            d.ctx.agent, escalation=Escalation(steer_at_calls=3, restrict_at_calls=1)
        ),
    )
    for i in range(60):
        d.apply(Admit(now=d.now))
        if d.rec.state is not S.CALLING_MODEL:
            break
        (call,) = d.commands(CallModel)
        d.reply(call, {"type": "tool", "name": "get_order", "args": {"order_id": f"o{i}"}})
        if d.rec.state is S.WAITING_TOOL:
            d.result(d.commands(DispatchTool)[0], {"status": "ok", "total_cents": i})
    assert d.rec.grants.read_only
    assert not d.history[0].record.grants.read_only


def test_a_truncated_reply_leaves_the_input_unchanged() -> None:
    d = CheckedDriver()
    d.reply(d.admit(), None, status=ReplyStatus.TRUNCATED)
    assert d.rec.state is S.READY


def test_stored_snapshots_and_rows_read_back_to_the_bytes_written() -> None:
    agent = make_agent()
    store = InProcessStore()
    written: list[tuple[int, bytes, list[ChainRow]]] = []

    def commit(prev: TrajectoryRecord, new: TrajectoryRecord, rows: list[ChainRow]) -> None:
        store.compare_and_set(new, prev.record_version, rows)
        written.append((new.record_version, new.to_json(), rows))

    rec = new_record(agent.profile.budget)
    store.create(rec)
    runner = EmbeddedRunner(
        KernelContext(agent.profile),
        ScriptedModel(RefundPolicy()),
        SupportStoreBackend(),
        commit=commit,
    )
    out = runner.run(rec)
    assert out.record.stop_reason is StopReason.DONE
    loaded = store.load(rec.tenant, rec.trajectory_id)
    assert loaded.to_json() == written[-1][1] == out.record.to_json()
    stored = store.read(rec.tenant, rec.trajectory_id)
    assert [r.model_dump_json() for r in stored] == [
        r.model_dump_json() for _, _, rows in written for r in rows
    ]
