"""Drive the step function by hand: one event at a time, as a fleet would deliver them."""

from __future__ import annotations

from typing import Any

from examples.support_store import make_agent
from kernel.amounts import Usage
from kernel.budget import Budget
from kernel.context import KernelContext, StepResult
from kernel.events import (
    Admit,
    ApprovalDecided,
    CallModel,
    Command,
    ControlRequested,
    DispatchTool,
    Event,
    HoldForApproval,
    ModelReplied,
    ReplyStatus,
    Tick,
    ToolResulted,
)
from kernel.record import ControlKind, TrajectoryRecord
from kernel.step import step
from tests.kernel.harness import new_record

PLAN = {
    "type": "plan",
    "steps": [
        {"id": "s1", "tool": "get_order", "depends_on": []},
        {"id": "s2", "tool": "issue_refund", "depends_on": ["s1"]},
        {"id": "s3", "tool": "send_status_email", "depends_on": ["s2"]},
    ],
}
READ = {"type": "tool", "name": "get_order", "args": {"order_id": "ord_1001"}, "plan_step": "s1"}
REFUND = {
    "type": "tool",
    "name": "issue_refund",
    "plan_step": "s2",
    "args": {"order_id": "ord_1001", "amount_cents": 3000, "reason": "damaged"},
}
BIG_REFUND = {
    "type": "tool",
    "name": "issue_refund",
    "plan_step": "s2",
    "args": {"order_id": "ord_1004", "amount_cents": 8000, "reason": "damaged"},
}


class Driver:
    """Holds the current record and the last result; every method applies one event."""

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget(
            max_steps=20, max_tool_calls=20, max_tokens=100_000, deadline_s=1000
        )
        self.ctx = KernelContext(make_agent(budget=self.budget).profile)
        self.rec: TrajectoryRecord = new_record(self.budget)
        self.now = 0.0
        self.last: StepResult | None = None
        self.history: list[StepResult] = []

    def apply(self, event: Event) -> StepResult:
        result = step(self.rec, event, self.ctx)
        self.rec = result.record
        self.last = result
        self.history.append(result)
        return result

    def commands(self, kind: type[Command]) -> list[Any]:
        return [c for c in (self.last.commands if self.last else []) if isinstance(c, kind)]

    def admit(self) -> CallModel:
        self.apply(Admit(now=self.now))
        (call,) = self.commands(CallModel)
        return call

    def reply(
        self,
        call: CallModel,
        content: Any,
        status: ReplyStatus = ReplyStatus.COMPLETED,
        usage: Usage | None = None,
        latency: float = 1.0,
    ) -> StepResult:
        self.now += latency
        return self.apply(
            ModelReplied(
                now=self.now,
                call_id=call.call_id,
                status=status,
                content=content,
                usage=usage or Usage(uncached_input=100, output=20),
                latency_s=latency,
            )
        )

    def result(self, cmd: DispatchTool, result: dict[str, Any], latency: float = 0.5) -> StepResult:
        self.now += latency
        return self.apply(
            ToolResulted(
                now=self.now,
                call_id=cmd.call_id,
                attempt_id=cmd.attempt_id,
                result=result,
                latency_s=latency,
            )
        )

    def control(
        self, kind: ControlKind, rid: str = "c1", instructions: str | None = None
    ) -> StepResult:
        return self.apply(
            ControlRequested(
                now=self.now,
                kind=kind,
                request_id=rid,
                requested_by="operator",
                instructions=instructions,
            )
        )

    def decide(
        self,
        hold: HoldForApproval,
        approve: bool = True,
        reviewer: str = "reviewer",
        **override: Any,
    ) -> StepResult:
        fields = {
            "now": self.now,
            "approval_id": hold.approval_id,
            "held_version": hold.held_version,
            "digest": hold.digest,
            "reviewer": reviewer,
            "approve": approve,
            **override,
        }
        return self.apply(ApprovalDecided(**fields))

    def tick(self, now: float) -> StepResult:
        self.now = now
        return self.apply(Tick(now=now))

    def to_reading(self) -> DispatchTool:
        """Plan, then propose the read: returns its dispatch."""
        self.reply(self.admit(), PLAN)
        self.reply(self.admit(), READ)
        (dispatch,) = self.commands(DispatchTool)
        return dispatch

    def to_approval(self) -> HoldForApproval:
        """Plan, read the order (15000 cents), then propose the big refund: returns its hold."""
        self.to_reading()
        self.result(self.commands(DispatchTool)[0], {"status": "ok", "total_cents": 15000})
        self.reply(self.admit(), BIG_REFUND)
        (hold,) = self.commands(HoldForApproval)
        return hold
