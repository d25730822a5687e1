"""Fencing tokens: every tool attempt and lookup carries one, and a later one is larger.

The directed tests follow one refund through a recovery and a ``fenced`` refusal. The property
test drives a trajectory through random recoveries, timeouts, lost answers and late deliveries
against a simulated backend that keeps the highest fence per key (and, for a ``lookup`` tool,
does not de-duplicate): fences grow, and no key's effect happens twice.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from examples.support_store import email_tool, refund_tool
from kernel.context import StepResult
from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import (
    Admit,
    CallModel,
    DispatchTool,
    Event,
    LookupEffect,
    ModelReplied,
    Recover,
    ReplyStatus,
    ToolResulted,
)
from kernel.record import OpStatus, StepStatus, TrajectoryRecord
from kernel.states import TERMINAL, LifecycleState, StopReason
from kernel.tools import FENCED, Catalog, OnUnknown
from tests.kernel.driver import PLAN, REFUND, Driver

S = LifecycleState
ToolCommand = DispatchTool | LookupEffect
REFUSED = {"status": "error", "code": FENCED}
READ = {"type": "tool", "name": "get_order", "args": {"order_id": "ord_1001"}, "plan_step": "s1"}
EMAIL = {
    "type": "tool",
    "name": "send_status_email",
    "args": {"order_id": "ord_1001"},
    "plan_step": "s3",
}
FINAL = {"type": "final", "outcome": "completed", "text": "Refund issued, email sent."}


def with_rule(d: Driver, rule: OnUnknown) -> Driver:
    """``d`` with its writes resolving unknown outcomes by ``rule``."""
    tools = {
        **d.ctx.agent.catalog.tools,
        "issue_refund": refund_tool(rule).spec,
        "send_status_email": email_tool(rule).spec,
    }
    agent = dataclasses.replace(d.ctx.agent, catalog=Catalog(tools))
    d.ctx = dataclasses.replace(d.ctx, agent=agent)
    return d


def answer(d: Driver, cmd: ToolCommand, result: dict[str, Any]) -> StepResult:
    d.now += 0.5
    event = ToolResulted(
        now=d.now,
        call_id=cmd.call_id,
        attempt_id=cmd.attempt_id,
        result=result,
        latency_s=0.5,
        looked_up=isinstance(cmd, LookupEffect),
    )
    return d.apply(event)


def refund_sent(rule: OnUnknown) -> tuple[Driver, DispatchTool]:
    d = with_rule(Driver(), rule)
    d.reply(d.admit(), PLAN)
    d.reply(d.admit(), REFUND)
    (refund,) = d.commands(DispatchTool)
    return d, refund


def only(d: Driver, kind: type[ToolCommand]) -> Any:
    (cmd,) = d.commands(kind)
    return cmd


# --- directed ----------------------------------------------------------------------------------


def test_a_dispatch_carries_a_fence_above_every_earlier_one_and_the_record_keeps_it() -> None:
    d, refund = refund_sent(OnUnknown.LOOKUP)
    assert refund.fence == d.rec.fence > 0, "the record remembers the highest fence given out"


def test_a_fence_given_out_after_a_rollback_is_above_every_fence_given_out_before() -> None:
    """Redis with appendfsync everysec may lose the last second of commits: the record comes
    back older, with a lower highest fence, while a backend may have seen the lost ones. A step
    taken later in time still gives out a larger fence than any the lost commits did."""
    d, _ = refund_sent(OnUnknown.LOOKUP)
    before_loss = d.rec.model_copy(deep=True)
    d.now = 1_000.0  # the lost second: a recovery and a lookup, at a real clock's time
    d.apply(Recover(now=d.now))
    lost = only(d, LookupEffect)
    assert lost.fence >= 1_000 * 1_000_000
    d.rec = before_loss  # the commit that gave it out is gone; the backend saw its fence
    d.now = 1_003.0  # Redis back three seconds later
    d.apply(Recover(now=d.now))
    assert only(d, LookupEffect).fence > lost.fence


def test_a_recovered_lookup_and_the_re_send_after_it_carry_ever_larger_fences() -> None:
    d, refund = refund_sent(OnUnknown.LOOKUP)
    d.apply(Recover(now=d.now))
    look = only(d, LookupEffect)
    assert refund.fence < look.fence == d.rec.fence
    answer(d, look, {"status": "absent"})
    again = only(d, DispatchTool)
    assert again.idempotency_key == refund.idempotency_key
    assert look.fence < again.fence == d.rec.fence


def test_a_re_send_after_an_unknown_outcome_carries_a_larger_fence() -> None:
    d, refund = refund_sent(OnUnknown.RESEND)
    answer(d, refund, {"status": "unknown", "code": "timeout"})
    again = only(d, DispatchTool)
    assert again.attempt_id != refund.attempt_id and again.fence > refund.fence


def test_a_late_fenced_write_settles_its_own_attempt_and_nothing_else() -> None:
    d, refund = refund_sent(OnUnknown.RESEND)
    d.apply(Recover(now=d.now))
    again = only(d, DispatchTool)
    before = d.rec
    late = answer(d, refund, REFUSED)
    rec = d.rec
    assert refund.attempt_id not in rec.ledger.reservations, "evidence: it had no effect"
    assert rec.ledger.tool_calls.actual == before.ledger.tool_calls.actual + 1
    assert rec.ledger.dollars.actual == before.ledger.dollars.actual
    assert again.attempt_id in rec.ledger.reservations, "the re-send is still owed"
    assert rec.operations[refund.call_id].status is OpStatus.REGISTERED
    assert rec.state is S.WAITING_TOOL and late.commands == []
    assert rec.last_observation == before.last_observation, "the model never sees it"
    assert [r.error for r in late.rows] == [FENCED]
    answer(d, again, {"status": "ok", "refunded_cents": 3000})
    assert d.rec.operations[refund.call_id].status is OpStatus.SETTLED
    assert d.rec.last_observation is not None
    assert d.rec.last_observation["status"] == "ok", "the re-send's result is what it sees"


def test_a_fenced_write_does_not_settle_a_call_whose_lookup_is_still_out() -> None:
    d, refund = refund_sent(OnUnknown.LOOKUP)
    d.apply(Recover(now=d.now))
    look = only(d, LookupEffect)
    answer(d, refund, REFUSED)  # the lookup reached the backend first, its answer has not come
    assert d.rec.operations[refund.call_id].open and d.rec.state is S.WAITING_TOOL
    answer(d, look, {"status": "absent"})
    again = only(d, DispatchTool)
    assert again.fence > look.fence


def test_an_older_lookups_absent_answer_settles_older_attempts_and_sends_nothing() -> None:
    # A lookup's "absent" shuts out the attempts sent before it, not those sent after it.
    d, refund = refund_sent(OnUnknown.LOOKUP)
    answer(d, refund, {"status": "unknown", "code": "timeout"})
    first = only(d, LookupEffect)
    d.apply(Recover(now=d.now))  # the lookup's worker is gone: looked up again
    second = only(d, LookupEffect)
    answer(d, second, {"status": "absent"})
    again = only(d, DispatchTool)
    stale = answer(d, first, {"status": "absent"})
    assert stale.commands == [], "no second re-send: the first one may yet take effect"
    assert again.attempt_id in d.rec.ledger.reservations
    assert refund.attempt_id not in d.rec.ledger.reservations


def test_a_duplicate_or_a_refusal_after_settlement_changes_nothing() -> None:
    d, refund = refund_sent(OnUnknown.RESEND)
    d.apply(Recover(now=d.now))
    again = only(d, DispatchTool)
    answer(d, refund, REFUSED)
    settled_once = d.rec
    assert answer(d, refund, REFUSED).record is settled_once
    answer(d, again, {"status": "ok", "refunded_cents": 3000})
    done = d.rec
    assert answer(d, refund, REFUSED).record is done


def test_a_refusal_of_the_awaited_attempt_is_resolved_as_the_tool_declares() -> None:
    # Something outside this record's history used the key with a newer fence: the key's
    # outcome is unknown, and resolved under a newer fence still.
    d, refund = refund_sent(OnUnknown.LOOKUP)
    answer(d, refund, REFUSED)
    look = only(d, LookupEffect)
    assert look.fence > refund.fence and refund.attempt_id not in d.rec.ledger.reservations
    d, refund = refund_sent(OnUnknown.RESEND)
    answer(d, refund, REFUSED)
    assert only(d, DispatchTool).fence > refund.fence
    d, refund = refund_sent(OnUnknown.STOP)
    answer(d, refund, REFUSED)
    assert d.rec.stop_reason is StopReason.UNKNOWN_OUTCOME


# --- the property --------------------------------------------------------------------------------


class FencingBackend:
    """Keeps the highest fence per key (calls and lookups) and refuses older writes; a write
    takes effect again under a repeated key unless ``deduplicate``."""

    def __init__(self, deduplicate: bool) -> None:
        self.deduplicate = deduplicate
        self.highest: dict[str, int] = {}
        self.effects: Counter[str] = Counter()
        self.refused = 0

    def serve(self, cmd: ToolCommand, is_write: bool) -> dict[str, Any]:
        key = cmd.idempotency_key
        if isinstance(cmd, LookupEffect):
            self.highest[key] = max(self.highest.get(key, 0), cmd.fence)
            return {"status": "ok"} if self.effects[key] else {"status": "absent"}
        if not is_write:
            return {"status": "ok", "total_cents": 4200, "order_status": "delivered"}
        if cmd.fence < self.highest.get(key, 0):
            self.refused += 1
            return dict(REFUSED)
        self.highest[key] = cmd.fence
        if not (self.deduplicate and self.effects[key]):
            self.effects[key] += 1
        return {"status": "ok", "refunded_cents": 3000, "sent": True}


def next_reply(rec: TrajectoryRecord) -> Any:
    """The refund policy's next proposal, read from the record."""
    if not rec.plan:
        return PLAN
    done = {s.id for s in rec.plan if s.status is StepStatus.DONE}
    for step, proposal in (("s1", READ), ("s2", REFUND), ("s3", EMAIL)):
        if step not in done:
            return proposal
    return FINAL


ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["deliver", "answer", "timeout", "lose", "recover"]),
        st.integers(0, 20),
    ),
    max_size=80,
)


class Fleet:
    """The driver, the commands sent but not delivered, the answers not yet stepped."""

    def __init__(self, rule: OnUnknown) -> None:
        self.d = with_rule(Driver(), rule)
        self.backend = FencingBackend(deduplicate=rule is not OnUnknown.LOOKUP)
        self.in_flight: list[ToolCommand] = []  # sent, not yet at the backend
        self.answers: list[tuple[ToolCommand, dict[str, Any]]] = []  # not yet stepped
        self.model: CallModel | None = None  # the newest model call, not yet answered
        self.fences: dict[str, list[int]] = {}  # call id -> fences of its attempts, in order

    def step(self, event: Event) -> None:
        before = self.d.rec
        try:
            result = self.d.apply(event)
        except (IllegalTransition, UnknownReference):
            assert self.d.rec is before, "a refused event changed the record"
            return
        for cmd in result.commands:
            if isinstance(cmd, DispatchTool | LookupEffect):
                assert before.fence < cmd.fence == result.record.fence, "above all given out"
                sent = self.fences.setdefault(cmd.call_id, [])
                assert not sent or cmd.fence > sent[-1], "a later attempt, a larger fence"
                sent.append(cmd.fence)
                self.in_flight.append(cmd)
            elif isinstance(cmd, CallModel):
                self.model = cmd
        seen = self.d.rec.last_observation or {}
        assert seen.get("code") != FENCED, "a refused write never reaches the model"

    def tool_event(self, cmd: ToolCommand, result: dict[str, Any]) -> ToolResulted:
        return ToolResulted(
            now=self.d.now,
            call_id=cmd.call_id,
            attempt_id=cmd.attempt_id,
            result=result,
            latency_s=0.1,
            looked_up=isinstance(cmd, LookupEffect),
        )

    def is_write(self, cmd: ToolCommand) -> bool:
        return cmd.tool in ("issue_refund", "send_status_email")

    def act(self, kind: str, n: int) -> None:
        d = self.d
        d.now += 0.1
        if kind == "deliver" and self.in_flight:  # it reaches the backend (late or not)
            cmd = self.in_flight.pop(n % len(self.in_flight))
            self.answers.append((cmd, self.backend.serve(cmd, self.is_write(cmd))))
        elif kind == "answer" and self.answers:
            cmd, result = self.answers.pop(n % len(self.answers))
            self.step(self.tool_event(cmd, result))
        elif kind == "timeout" and self.in_flight:  # reported unknown; may still land later
            cmd = self.in_flight[n % len(self.in_flight)]
            if self.is_write(cmd) and isinstance(cmd, DispatchTool):
                self.step(self.tool_event(cmd, {"status": "unknown", "code": "timeout"}))
        elif kind == "lose" and self.answers:  # its worker died before stepping it
            self.answers.pop(n % len(self.answers))
        elif kind == "recover":
            self.step(Recover(now=d.now))
        self.advance_model()

    def advance_model(self) -> None:
        """The model answers at once: a turn runs until it waits for a tool (or ends)."""
        d = self.d
        for _ in range(4):
            if d.rec.state is S.READY:
                self.step(Admit(now=d.now))
            elif d.rec.state is S.CALLING_MODEL and self.model is not None:
                call, self.model = self.model, None
                reply = ModelReplied(
                    now=d.now,
                    call_id=call.call_id,
                    status=ReplyStatus.COMPLETED,
                    content=next_reply(d.rec),
                    latency_s=0.1,
                )
                self.step(reply)
            else:
                return

    def settle(self) -> None:
        """Deliver (newest first, so older attempts land last) and answer everything,
        recovering whatever still waits, until the run ends."""
        for _ in range(400):
            if self.d.rec.state in TERMINAL and not self.in_flight and not self.answers:
                return
            if self.in_flight:
                self.act("deliver", -1)
            elif self.answers:
                self.act("answer", 0)
            else:
                self.act("recover", 0)  # what it waits for was lost: recover, as a router does
        raise AssertionError(f"the run did not end: {self.d.rec.state}")


@settings(max_examples=300, deadline=None)
@given(ACTIONS, st.sampled_from([OnUnknown.LOOKUP, OnUnknown.RESEND]))
def test_fences_grow_and_no_effect_happens_twice(
    actions: list[tuple[str, int]], rule: OnUnknown
) -> None:
    fleet = Fleet(rule)
    fleet.advance_model()
    for kind, n in actions:
        fleet.act(kind, n)
    fleet.settle()
    rec = fleet.d.rec
    assert rec.state in TERMINAL
    assert all(n <= 1 for n in fleet.backend.effects.values()), fleet.backend.effects
    if rec.stop_reason is StopReason.DONE:
        assert {key.rsplit(":", 2)[0] for key in fleet.backend.effects} == {"t1:s2", "t1:s3"}
