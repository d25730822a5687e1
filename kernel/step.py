"""The step function: one event in, a new record and the commands to carry out.

``step(record, event, ctx)`` is pure: the clock reading comes in the event, ids are derived
from the record's own counters, and the token estimator is injected through ``ctx``. It never
mutates its input; the record it returns is a new value. The embedded runner, the Celery
worker, replay and the property tests all drive this one function.

Bad input (an event naming an unknown call, attempt, approval or a state it cannot apply to)
raises an error from :mod:`kernel.errors` and changes nothing. A duplicate of evidence already
recorded returns the record unchanged with no commands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel.agent import AgentProfile
from kernel.amounts import Amounts, Dimension, model_call_liability
from kernel.chain import ChainRow, RowKind
from kernel.closing import closing_message
from kernel.errors import AdmissionRefused, IllegalTransition
from kernel.events import (
    Admit,
    ApprovalDecided,
    CallModel,
    Command,
    ControlRequested,
    Enqueue,
    Event,
    Finalize,
    Finish,
    ModelReplied,
    Recover,
    Tick,
    ToolProgress,
    ToolResulted,
)
from kernel.fastmodel import construct, shallow_copy
from kernel.lifecycle import Cause, Decision, transition
from kernel.progress import signature
from kernel.record import (
    ApprovalStatus,
    ErrorStreak,
    Operation,
    OpKind,
    OpStatus,
    PlanStep,
    TrajectoryRecord,
)
from kernel.render import Estimator, estimate_tokens, render
from kernel.states import LIVE, LifecycleState, StopReason, terminal_state_for
from kernel.tools import ToolSpec

S = LifecycleState

MISFIT_STOP = {
    Dimension.STEPS: StopReason.MAX_STEPS,
    Dimension.TOOL_CALLS: StopReason.MAX_TOOL_CALLS,
    Dimension.TOKENS: StopReason.MAX_TOKENS,
    Dimension.DOLLARS: StopReason.MAX_COST,
}
RECONCILER = "reconciler"  # the owner an unsettled operation is handed to at exit
ENQUEUE = Enqueue()  # commands are frozen values: one serves every turn that ends READY


@dataclass(frozen=True)
class KernelContext:
    """What the kernel is given rather than reaching for: the agent and the estimator."""

    agent: AgentProfile
    estimator: Estimator = estimate_tokens
    # A local capacity gate for tools (sandbox slots, memory): (record, spec, args) -> fits.
    # An approved action that does not fit stays held; [quota] plugs its gates in here.
    capacity: Callable[[TrajectoryRecord, ToolSpec, dict[str, Any]], bool] | None = None


@dataclass
class StepResult:
    """The outcome of one step: the new record, commands to carry out, chain rows to append."""

    record: TrajectoryRecord
    commands: list[Command] = field(default_factory=list)
    rows: list[ChainRow] = field(default_factory=list)
    quarantined: IllegalTransition | None = None  # a reply kept only as diagnostics
    note: str | None = None  # why nothing happened (duplicate, not admitted, ...)
    ack: dict[str, Any] | None = None  # a control request's milestones (received, stopped...)


class Turn:
    """The mutable working state of one step: a private copy of the record plus outputs."""

    __slots__ = (
        "_owned_steps",
        "_plan_owned",
        "ack",
        "commands",
        "ctx",
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
        return StepResult(self.rec, self.commands, rows, self.quarantined, self.note, self.ack)

    # --- ending a turn and ending the run ------------------------------------------------

    def end_turn(self, cause: Cause) -> None:
        """Back to READY; then the progress check decides between the queue and a stop."""
        rec = self.rec
        self.move(S.READY, cause)
        rec.wait_deadline = None
        rec.stalls = 0 if signature(rec) != rec.turn_signature else rec.stalls + 1
        if rec.stalls >= rec.budget.max_stalls:
            self.stop(StopReason.NO_PROGRESS)
        elif rec.error_streak.count >= rec.budget.max_same_error:
            self.stop(StopReason.FAILED, f"{rec.error_streak.kind} {rec.error_streak.count} times")
        elif rec.pending_control is not None:
            from kernel.control import carry_out_hold  # control builds on the step

            carry_out_hold(self)
        else:
            self.commands.append(ENQUEUE)

    def stop(self, reason: StopReason, detail: str | None = None) -> None:
        """Every exit: FINALIZING, hand off what is still owed, the message, the terminal."""
        rec = self.rec
        if rec.state in LIVE:
            self.move(S.FINALIZING, Cause.STOP, reason)
        elif rec.state is not S.FINALIZING:
            raise IllegalTransition(rec.state.value, S.FINALIZING.value, "stop", "already ended")
        rec.stop_reason = rec.stop_reason or reason
        for op in rec.operations.values():
            if op.open and op.settlement_owner == "kernel":
                # Settlement rule: the reservation stays; a named owner takes the obligation.
                op.settlement_owner = RECONCILER
                op.status = OpStatus.HANDED_OFF if op.status is OpStatus.REGISTERED else op.status
        message = closing_message(rec, self.ctx.agent.catalog, rec.stop_reason)
        rec.closing_message = message
        self.row(RowKind.STOP, outcome=rec.stop_reason.value, error=detail)
        target = terminal_state_for(rec.stop_reason)
        self.move(target, Cause.FINISH)
        self.commands.append(construct(Finish, state=target, stop=rec.stop_reason, message=message))


# --- the entry point -------------------------------------------------------------------------


Handler = Callable[[Turn, Any], None]
_HANDLERS: dict[type[Event], Handler] = {}


def _handlers() -> dict[type[Event], Handler]:
    """The handler of each event type, built on first use: its modules build on this one."""
    if not _HANDLERS:
        from kernel import control, fold, recovery, results

        _HANDLERS.update(
            {
                Admit: lambda turn, ev: admit(turn),
                ModelReplied: fold.on_model_reply,
                ToolResulted: results.on_tool_result,
                ApprovalDecided: control.on_approval,
                ControlRequested: control.on_control,
                Tick: lambda turn, ev: control.on_tick(turn),
                ToolProgress: control.on_progress,
                Finalize: finalize,
                Recover: lambda turn, ev: recovery.on_recover(turn),
            }
        )
    return _HANDLERS


def step(rec: TrajectoryRecord, event: Event, ctx: KernelContext) -> StepResult:
    """Apply one event to a record; see the module docstring for the contract."""
    handler = _handlers().get(type(event))
    if handler is None:  # pragma: no cover - the union is closed
        raise TypeError(f"not an event: {event!r}")
    turn = Turn(rec, ctx, event.now)
    handler(turn, event)
    if not turn.rows and not turn.commands and turn.quarantined is None:
        # Nothing happened: return the caller's record untouched, so no version is spent.
        return StepResult(rec, note=turn.note, ack=turn.ack)
    if turn.rec.record_version == rec.record_version:
        turn.rec.record_version += 1  # every committed change is a new version
    return turn.result()


def finalize(turn: Turn, ev: Finalize) -> None:
    """End the run for a reason the runtime decided; only from a state where nothing the
    kernel admitted is left to act (READY, PAUSED, AWAITING_APPROVAL); a refusal otherwise."""
    rec = turn.rec
    if rec.state not in (S.READY, S.PAUSED, S.AWAITING_APPROVAL):
        raise IllegalTransition(
            rec.state.value,
            S.FINALIZING.value,
            "finalize",
            "finalize a trajectory only between turns",
        )
    if rec.held is not None and rec.held.status.value == "held":
        rec.held.status = ApprovalStatus.WITHDRAWN
        rec.held.decided_at = turn.now
    rec.pending_control = None
    turn.stop(ev.stop, ev.detail or None)


def calls_that_fit(rec: TrajectoryRecord, liability: Amounts) -> int:
    """How many more calls at this liability fit beside the finalization reserve."""
    fits: list[int] = []
    for dim in Dimension:
        need = liability.get(dim)
        if need:
            fits.append(int(rec.ledger.headroom(dim) // need))
    return max(min(fits), 0) if fits else 1_000_000


def escalate(turn: Turn, liability: Amounts) -> bool:
    """Staged escalation (seed 004 table 9) from the admission terms; True if a stage began.

    Steer: the view shows the remaining allowance and asks for a smaller step or the final
    report. Restrict: grants narrow to read-only tools. Finalize is the admission refusal
    itself, when the next call no longer fits beside the reserve.
    """
    rec, policy = turn.rec, turn.ctx.agent.escalation
    assert policy is not None
    left = calls_that_fit(rec, liability)
    stage = None
    if left <= policy.restrict_at_calls and rec.escalation != "restrict":
        stage = "restrict"
        rec.grants = rec.grants.model_copy(update={"read_only": True})  # replaced, shared
    elif left <= policy.steer_at_calls and rec.escalation is None:
        stage = "steer"
    if stage is None:
        return False
    rec.escalation = stage
    turn.row(RowKind.CONTROL, outcome=f"escalation_{stage}", detail={"calls_left": left})
    return True


def admit(turn: Turn) -> None:
    """Admission of the next model call: the guarded READY -> CALLING_MODEL transition.

    Checks in seed 000's order (steps, tool calls, deadline, tokens) and then the whole
    bounded-liability test; a call that cannot fit ends the run with the matching stop.
    The call is registered and reserved before the CallModel command exists.
    """
    rec, budget = turn.rec, turn.rec.budget
    if rec.state is not S.READY:
        turn.note = f"not admitted: trajectory is {rec.state.value}"
        return
    if turn.now - rec.submitted_at >= budget.wall_clock_s:
        turn.stop(StopReason.WALL_CLOCK)
        return
    if rec.pending_control is not None:
        from kernel.control import carry_out_hold

        carry_out_hold(turn)
        return
    led = rec.ledger
    if led.headroom(Dimension.STEPS) < 1:
        turn.stop(StopReason.MAX_STEPS)
        return
    if led.headroom(Dimension.TOOL_CALLS) < 1:
        turn.stop(StopReason.MAX_TOOL_CALLS)
        return
    if rec.active_s >= budget.deadline_s:
        turn.stop(StopReason.DEADLINE)
        return
    view = render(rec)
    tokens_in = turn.ctx.estimator(view)
    cap = budget.max_output_tokens
    liability = model_call_liability(turn.ctx.agent.model.price, tokens_in, cap)
    if turn.ctx.agent.escalation is not None and escalate(turn, liability):
        view = render(rec)  # the view now carries the escalation notice
        tokens_in = turn.ctx.estimator(view)
        liability = model_call_liability(turn.ctx.agent.model.price, tokens_in, cap)
    call_id = f"{rec.trajectory_id}/m{rec.turn + 1}"
    attempt = f"{call_id}/a1"

    def register(r: TrajectoryRecord) -> None:
        r.ledger.admit(attempt, liability)  # may raise AdmissionRefused: nothing changes
        r.operations[call_id] = construct(
            Operation,
            op_id=call_id,
            call_id=call_id,
            kind=OpKind.MODEL,
            attempts=[attempt],
            idempotency_key=call_id,
            epoch=r.control_epoch,
            reservation=liability,
        )
        r.turn += 1
        r.turn_signature = signature(r)

    try:
        transition(rec, S.CALLING_MODEL, turn.decide(Cause.ADMIT), turn.now, admit=register)
    except AdmissionRefused as refused:  # the budget clause of the admission check
        turn.stop(MISFIT_STOP[Dimension(refused.dimension)])
        return
    turn.commands.append(
        construct(
            CallModel,
            call_id=call_id,
            attempt_id=attempt,
            view=view,
            max_output_tokens=cap,
            timeout_s=round(budget.deadline_s - rec.active_s, 6),
        )
    )
