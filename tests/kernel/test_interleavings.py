"""Random interleavings of control requests, late and duplicate results, and replies.

Whatever the order: no write takes effect twice (the same tool and arguments are sent once,
whatever turn proposes them), no result registered under an older epoch reaches the view, no
reservation is released without evidence, no account ends above its allowance, and every
trajectory can still reach a terminal state: at once by a kill, or by a cancel once every call
in flight has answered.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernel.amounts import Usage
from kernel.errors import IllegalTransition, UnknownReference
from kernel.events import (
    Admit,
    CallModel,
    ControlRequested,
    DispatchTool,
    HoldForApproval,
    ModelReplied,
    ReplyStatus,
    ToolResulted,
)
from kernel.progress import digest
from kernel.record import ControlKind, OpKind
from kernel.states import TERMINAL
from kernel.step import step
from kernel.tools import ToolKind
from tests.kernel.driver import BIG_REFUND, PLAN, READ, Driver

REPLIES = [
    PLAN,
    READ,
    BIG_REFUND,
    {
        "type": "tool",
        "name": "send_status_email",
        "args": {"order_id": "ord_1001"},
        "plan_step": "s3",
    },
    {"type": "final", "outcome": "completed", "text": "x"},
    "garbage",
]
ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 0)),
        st.tuples(st.just("reply"), st.integers(0, 50)),
        st.tuples(st.just("result"), st.integers(0, 50)),
        st.tuples(st.just("duplicate"), st.integers(0, 50)),
        st.tuples(st.just("control"), st.integers(0, 4)),
        st.tuples(st.just("approve"), st.integers(0, 1)),
        st.tuples(st.just("tick"), st.integers(0, 4000)),
    ),
    max_size=60,
)
KINDS = [
    ControlKind.PAUSE,
    ControlKind.RESUME,
    ControlKind.CANCEL,
    ControlKind.KILL,
    ControlKind.INTERRUPT,
]


@settings(max_examples=300, deadline=None)
@given(ACTIONS, st.integers(0, 10_000))
def test_random_interleavings_keep_the_invariants(
    actions: list[tuple[str, int]], seed: int
) -> None:
    d = Driver()
    calls: list[CallModel] = []
    dispatches: list[DispatchTool] = []
    answered: list[tuple[DispatchTool, dict[str, Any]]] = []
    holds: list[HoldForApproval] = []
    writes: set[str] = set()
    for i, (kind, n) in enumerate(actions):
        before = d.rec
        try:
            if kind == "admit":
                d.apply(Admit(now=d.now))
            elif kind == "reply" and calls:
                call = calls[n % len(calls)]
                d.now += 1
                d.apply(
                    ModelReplied(
                        now=d.now,
                        call_id=call.call_id,
                        status=ReplyStatus.COMPLETED if (seed + i) % 5 else ReplyStatus.CANCELED,
                        content=REPLIES[(seed + n) % len(REPLIES)],
                        usage=None if (seed + i) % 7 == 0 else Usage(uncached_input=50, output=10),
                        latency_s=1.0,
                    )
                )
            elif kind == "result" and dispatches:
                cmd = dispatches[n % len(dispatches)]
                result = {"status": "ok", "total_cents": 15000, "order_status": "delivered"}
                d.result(cmd, result)
                answered.append((cmd, result))
                if d.rec.last_observation == result and before.last_observation != result:
                    op = before.operations[cmd.call_id]  # staged: it must have been current
                    assert op.eligible and op.epoch == before.control_epoch
            elif kind == "duplicate" and answered:
                cmd, result = answered[n % len(answered)]
                d.result(cmd, result)
                assert d.rec is before, "a duplicate result is settled and staged once"
            elif kind == "control":
                d.control(KINDS[n], rid=f"c{i}", instructions="new goal")
            elif kind == "approve" and holds:
                d.decide(holds[-1], approve=bool(n))
            elif kind == "tick":
                d.tick(d.now + n)
            else:
                continue
        except (IllegalTransition, UnknownReference):
            assert d.rec is before, "a refused event changed the record"
            continue
        result = d.last
        assert result is not None
        for cmd in result.commands:
            if isinstance(cmd, CallModel):
                calls.append(cmd)
            elif isinstance(cmd, DispatchTool):
                spec = d.ctx.agent.catalog.get(cmd.tool)
                if spec is not None and spec.kind is ToolKind.WRITE:
                    effect = digest([cmd.tool, cmd.args])
                    assert effect not in writes, f"{cmd.tool} {cmd.args} sent twice"
                    writes.add(effect)
                dispatches.append(cmd)
            elif isinstance(cmd, HoldForApproval):
                holds.append(cmd)
        rec = d.rec
        # staged observations come only from results registered under the current epoch
        for op in rec.operations.values():
            if (
                op.kind is OpKind.TOOL
                and op.plan_step
                and any(s.id == op.plan_step and s.status.value == "done" for s in rec.plan)
            ):
                assert op.evidence is not None
        # no reservation released without evidence
        for op in rec.operations.values():
            for attempt in op.attempts:
                if attempt not in rec.ledger.reservations and op.kind is OpKind.TOOL:
                    assert op.evidence is not None, f"{attempt} released without evidence"
        for dim_acct in (
            rec.ledger.steps,
            rec.ledger.tool_calls,
            rec.ledger.tokens,
            rec.ledger.dollars,
        ):
            assert dim_acct.actual + dim_acct.reserved <= dim_acct.allowance
    # every trajectory can still reach a terminal state
    if d.rec.state not in TERMINAL:
        kill = ControlRequested(
            now=d.now, kind=ControlKind.KILL, request_id="kill", requested_by="operator"
        )
        assert step(d.rec, kill, d.ctx).record.state in TERMINAL, "a kill ends it at once"
        _cancel_and_answer(d)
    assert d.rec.state in TERMINAL, d.rec.state


def _cancel_and_answer(d: Driver) -> None:
    """A cancel, then an answer for every call still in flight: the run must end. (A kill
    would end it at once; the cancel is the one that waits.)"""
    d.control(ControlKind.CANCEL, rid="final-cancel")
    for op in list(d.rec.operations.values()):
        if d.rec.state in TERMINAL or not op.open:
            continue
        d.now += 1
        if op.kind is OpKind.MODEL:
            d.apply(
                ModelReplied(
                    now=d.now,
                    call_id=op.call_id,
                    status=ReplyStatus.CANCELED,
                    content=None,
                    usage=Usage(uncached_input=10, output=1),
                    latency_s=1.0,
                )
            )
        else:
            d.apply(
                ToolResulted(
                    now=d.now,
                    call_id=op.call_id,
                    attempt_id=op.attempts[-1],
                    result={"status": "error", "code": "canceled"},
                    latency_s=1.0,
                )
            )
