"""The working copy of one step, and what the kernel is given and gives back.

A handler of :func:`kernel.step.step` receives a :class:`Draft`: a private copy of the record
to change, plus the commands and chain rows the step emits. The draft's helpers are the moves
every handler shares: take an edge of the lifecycle table, append to the chain, end the turn,
stop the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kernel import finalizing
from kernel.agent import AgentProfile, Escalation
from kernel.amounts import Dimension
from kernel.authority import AuthorityLookup, TenantAuthority
from kernel.chain import ChainRow, RowKind
from kernel.closing import closing_message
from kernel.errors import IllegalTransition
from kernel.events import Command, DispatchTool, Enqueue, Finish, LookupEffect, StartJob
from kernel.fastmodel import construct, shallow_copy
from kernel.jsontext import plain_text
from kernel.lifecycle import Cause, Decision, transition
from kernel.progress import signature
from kernel.record import (
    ControlKind,
    ErrorStreak,
    OpStatus,
    PlanStep,
    SettlementOwner,
    TrajectoryRecord,
)
from kernel.render import SYSTEM_PROMPT, Estimator, estimate_tokens
from kernel.states import LIVE, LifecycleState, StopReason, terminal_state_for
from kernel.tools import ToolSpec, wire_tools

S = LifecycleState

#: The stop for a call the budget cannot fit, by the dimension that refused it.
MISFIT_STOP = {
    Dimension.STEPS: StopReason.MAX_STEPS,
    Dimension.TOOL_CALLS: StopReason.MAX_TOOL_CALLS,
    Dimension.TOKENS: StopReason.MAX_TOKENS,
    Dimension.DOLLARS: StopReason.MAX_COST,
}
ENQUEUE = Enqueue()  # commands are frozen values: one serves every turn that ends READY
FENCED = (DispatchTool, LookupEffect, StartJob)  # the commands that carry a fencing token
#: Recoveries in a row (no turn ending on its own between them) after which a run ends FAILED:
#: a fault of the fleet is no step of the agent and never counts towards its stalls, but a
#: trajectory no worker manages to carry on must still end (seed 004: no state is a trap).
MAX_RECOVERIES = 5


@dataclass(frozen=True)
class KernelContext:
    """What the kernel is given rather than reaching for: the agent and the estimator."""

    agent: AgentProfile
    estimator: Estimator = estimate_tokens
    # A capacity check at approval: (record, spec, args) -> fits. An approved action that does
    # not fit stays approved and held, re-checked at each tick. The fleet leaves it unset: a
    # tool's capacity is its gate, asked where the call runs (docs/adr/0203-backpressure.md).
    capacity: Callable[[TrajectoryRecord, ToolSpec, dict[str, Any]], bool] | None = None
    # The operators' settings of a tenant (the fleet's document): grants, freeze, escalation.
    authority: AuthorityLookup | None = None

    def authority_of(self, tenant: str) -> TenantAuthority | None:
        """The settings in force for ``tenant`` (None: none set)."""
        return self.authority(tenant) if self.authority is not None else None

    def escalation_of(self, tenant: str) -> Escalation | None:
        """Staged escalation for ``tenant``'s runs: the tenant's setting, else the agent's."""
        own = self.authority_of(tenant)
        if own is not None and own.escalation is not None:
            return own.escalation
        return self.agent.escalation

    @cached_property
    def unseen_tokens(self) -> int:
        """Input tokens of every call that the view's estimate does not count (computed once):
        the provider's framing; and for a model reached over a protocol (sent the tool
        schemas), its system message and the schemas in the form they are sent."""
        model = self.agent.model
        if not model.sends_tool_schemas:
            return model.framing_tokens
        sent = plain_text(wire_tools(self.agent.catalog.tools.values()))
        return model.framing_tokens + self.estimator(SYSTEM_PROMPT) + self.estimator(sent)

    def reserved_input(self, estimated: int) -> int:
        """The input tokens admission reserves for a view estimated at ``estimated``."""
        margin = self.agent.model.input_margin
        extra = math.ceil(estimated * margin) if margin else 0
        return estimated + extra + self.unseen_tokens


@dataclass
class StepResult:
    """The outcome of one step: the new record, commands to carry out, chain rows to append."""

    record: TrajectoryRecord
    commands: list[Command] = field(default_factory=list)
    rows: list[ChainRow] = field(default_factory=list)
    quarantined: IllegalTransition | None = None  # a reply kept only as diagnostics
    note: str | None = None  # why nothing happened (duplicate, not admitted, ...)
    ack: dict[str, Any] | None = None  # a control request's milestones (received, stopped...)


class Draft:
    """The working copy of one step: a private copy of the record, and what the step emits."""

    __slots__ = (
        "_owned_steps",
        "_plan_owned",
        "ack",
        "commands",
        "ctx",
        "fence",
        "note",
        "now",
        "quarantined",
        "rec",
        "rows",
    )

    def __init__(self, rec: TrajectoryRecord, ctx: KernelContext, now: float) -> None:
        self.rec = rec.clone()
        self.ctx = ctx
        self.now = now
        # The fencing token of every tool attempt and lookup this step sends: above every token
        # the run gave out before, and at least the step's time in microseconds, so a token
        # given out after the store lost its last second of commits (Redis restarted with
        # appendfsync everysec, the record rolled back) is still above every token given out
        # before the loss, which the backends may have seen (docs/adr/0046-fencing.md).
        self.fence = max(rec.fence + 1, int(now * 1_000_000))
        self.commands: list[Command] = []
        self.rows: list[dict[str, Any]] = []  # chain rows, completed in result()
        self.quarantined: IllegalTransition | None = None
        self.note: str | None = None
        self.ack: dict[str, Any] | None = None
        self._plan_owned = False
        self._owned_steps: set[str] = set()  # plan steps copied one by one (``own_step``)

    # --- small helpers used by every handler -------------------------------------------

    def decide(self, cause: Cause, stop: StopReason | None = None) -> Decision:
        """A decision on the current version of the working copy."""
        tid, version = self.rec.trajectory_id, self.rec.record_version
        return Decision(f"{tid}/v{version}/{cause.value}", version, cause, stop)

    def move(self, target: S, cause: Cause, stop: StopReason | None = None) -> None:
        """Take one edge of the lifecycle table (raises if the table or a guard refuses)."""
        transition(self.rec, target, self.decide(cause, stop), self.now)

    def row(self, kind: RowKind, **fields: Any) -> None:
        """Append one row to the execution chain (built in :meth:`result`, with the version
        the step commits at)."""
        rec = self.rec
        self.rows.append(
            {
                "trajectory_id": rec.trajectory_id,
                "tenant": rec.tenant,
                "user": rec.user,
                "index": rec.chain_length,
                "step": rec.turn,
                "kind": kind,
                "at": self.now,
                **fields,
            }
        )
        rec.chain_length += 1

    def spend_time(self, seconds: float) -> None:
        """Active time: model and tool latency, never beyond the deadline."""
        rec = self.rec
        rec.active_s = round(min(rec.active_s + seconds, rec.budget.deadline_s), 6)

    def observe(self, observation: dict[str, Any]) -> None:
        """Stage an observation for the next view."""
        self.rec.last_observation = observation

    def recoverable(self, kind: str, observation: dict[str, Any]) -> None:
        """A recoverable error: fed back as an observation and counted while it repeats."""
        streak = self.rec.error_streak
        count = streak.count + 1 if streak.kind == kind else 1
        self.rec.error_streak = construct(ErrorStreak, kind=kind, count=count)  # replaced, shared
        self.observe(observation)

    def clear_error_streak(self) -> None:
        """A step without a recoverable error ends the streak."""
        streak = self.rec.error_streak
        if streak.kind is not None or streak.count:
            self.rec.error_streak = construct(ErrorStreak)

    def own_plan(self) -> list[PlanStep]:
        """The plan, with steps this turn may change (the clone shares them with its input)."""
        if not self._plan_owned:
            owned = self._owned_steps
            self.rec.plan = [s if s.id in owned else shallow_copy(s) for s in self.rec.plan]
            self._plan_owned = True
        return self.rec.plan

    def own_step(self, step_id: str | None) -> PlanStep | None:
        """The plan step ``step_id`` (None if the plan has none), which this turn may change:
        only that step is copied, the first time it is asked for."""
        plan = self.rec.plan
        for i, step in enumerate(plan):
            if step.id != step_id:
                continue
            if self._plan_owned or step_id in self._owned_steps:
                return step
            if not self._owned_steps:
                plan = self.rec.plan = list(plan)  # the clone shares the list too
            step = plan[i] = shallow_copy(step)
            self._owned_steps.add(step_id)
            return step
        return None

    def result(self) -> StepResult:
        """Package the outcome; the chain rows carry the version they are committed with."""
        version = self.rec.record_version
        rows = [construct(ChainRow, record_version=version, **r) for r in self.rows]
        if self.fence > self.rec.fence and any(isinstance(c, FENCED) for c in self.commands):
            self.rec.fence = self.fence  # given out: the next step's tokens go above it
        return StepResult(self.rec, self.commands, rows, self.quarantined, self.note, self.ack)

    # --- ending a turn and ending the run ------------------------------------------------

    def end_turn(self, cause: Cause, counts_as_step: bool = True) -> None:
        """Back to READY; then the progress check decides between the queue and a stop. A
        turn that is not a step of the task (a compaction) neither stalls nor progresses."""
        rec = self.rec
        self.move(S.READY, cause)
        rec.wait_deadline = None
        if counts_as_step:
            rec.stalls = 0 if signature(rec) != rec.turn_signature else rec.stalls + 1
            rec.recoveries = 0
        pc = rec.pending_control
        if pc is not None and pc.kind is not ControlKind.PAUSE:
            self.carry_out_pending_control()  # an operator's stop outranks the run's own
        elif rec.recoveries > MAX_RECOVERIES:
            why = f"its turn was recovered {rec.recoveries} times: the fleet could not serve it"
            self.stop(StopReason.FAILED, why)
        elif rec.stalls >= rec.budget.max_stalls:
            self.stop(StopReason.NO_PROGRESS)
        elif rec.error_streak.count >= rec.budget.max_same_error:
            self.stop(StopReason.FAILED, f"{rec.error_streak.kind} {rec.error_streak.count} times")
        elif rec.pending_control is not None:
            self.carry_out_pending_control()
        else:
            self.commands.append(ENQUEUE)

    def stop(self, reason: StopReason, detail: str | None = None) -> None:
        """Every exit: FINALIZING; then the agent's closing step, funded from the finalization
        reserve (:mod:`kernel.finalizing`), or, with none to run, the end at once."""
        rec = self.rec
        if rec.state in LIVE:
            self.move(S.FINALIZING, Cause.STOP, reason)
        elif rec.state is not S.FINALIZING:
            raise IllegalTransition(rec.state.value, S.FINALIZING.value, "stop", "already ended")
        rec.stop_reason = rec.stop_reason or reason
        command, closing = finalizing.begin(rec, self.ctx, self.now, detail)
        if closing:
            self.row(RowKind.CONTROL, outcome="finalizing", detail={"stop": reason, **closing})
        if command is not None:
            self.commands.append(command)  # the run ends when its closing call does
            return
        self.finish(detail)

    def finish(self, detail: str | None = None) -> None:
        """End a run in FINALIZING: hand off what is still owed, the message, the terminal."""
        rec = self.rec
        assert rec.stop_reason is not None  # FINALIZING is entered with a stop reason
        target = terminal_state_for(rec.stop_reason)
        if target is not S.COMPLETED:  # completion owes nothing: its guard transfers nothing
            for op in rec.operations.values():
                if op.open and op.settlement_owner is SettlementOwner.KERNEL:
                    # Settlement rule: the reservation stays; a named owner takes the obligation.
                    op.settlement_owner = SettlementOwner.RECONCILER
                    if op.status is OpStatus.REGISTERED:
                        op.status = OpStatus.HANDED_OFF
        message = closing_message(rec, self.ctx.agent.catalog, rec.stop_reason)
        rec.closing_message = message
        self.row(RowKind.STOP, outcome=rec.stop_reason.value, error=detail)
        self.move(target, Cause.FINISH)
        self.commands.append(construct(Finish, state=target, stop=rec.stop_reason, message=message))

    def carry_out_pending_control(self) -> None:
        """Carry out the pending control on a trajectory that is (now) READY."""
        rec = self.rec
        pc = rec.pending_control
        if pc is None:
            return
        if pc.kind is ControlKind.PAUSE:
            if rec.state is S.READY:
                self.move(S.PAUSED, Cause.PAUSE)
        elif pc.kind in (ControlKind.CANCEL, ControlKind.KILL):
            rec.pending_control = None
            self.stop(StopReason.CANCELED if pc.kind is ControlKind.CANCEL else StopReason.KILLED)
