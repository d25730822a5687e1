"""FINALIZING is a state a run is seen in: a funded closing step runs there (seed 004 10.4.4).

An agent that declares a closing report has it written, when a stop is decided, by one model
call admitted against the finalization reserve and bounded by the budget's own ``finalize_s``;
an agent that declares none passes through FINALIZING at once, as before.
"""

from __future__ import annotations

import random
from dataclasses import replace

from examples.support_store import REPORT_RESERVE, make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import (
    RefundPolicy,
    ReplanningRefund,
    RewooRefund,
    new_ids,
)
from kernel.agent import AgentModule, ClosingReport, Escalation, LoopShape
from kernel.amounts import Amounts, Dimension
from kernel.budget import Budget
from kernel.chain import ChainRow, RowKind
from kernel.context import KernelContext
from kernel.events import Admit, CallModel, CancelCall, Finish, Recover, Tick
from kernel.record import OpStatus, SettlementOwner, TrajectoryRecord
from kernel.states import LIVE, LifecycleState, StopReason
from kernel.step import step
from tests.kernel.harness import GOAL, new_record
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel

S = LifecycleState
GOAL_1004 = "refund the damaged item on order ord_1004"  # held for approval under ReWOO
#: Three ordinary steps: the fourth is the reserve's, and only the closing call may use it.
BUDGET = Budget(max_steps=4, max_tokens=6000, reserve=REPORT_RESERVE)


def reporting(budget: Budget = BUDGET, escalation: Escalation | None = None) -> AgentModule:
    agent = make_agent("reporting", budget=budget, closing=ClosingReport())
    return replace(agent, profile=replace(agent.profile, escalation=escalation))


class Committed:
    """The store hook of the embedded runner: every committed record, in order."""

    def __init__(self) -> None:
        self.records: list[TrajectoryRecord] = []

    def __call__(
        self, before: TrajectoryRecord, after: TrajectoryRecord, rows: list[ChainRow]
    ) -> None:
        self.records.append(after)


def run(agent: AgentModule, budget: Budget = BUDGET, latency: float = 1.5, policy=None):  # type: ignore[no-untyped-def]
    commits = Committed()
    model = ScriptedModel(policy or RefundPolicy(latency=latency))
    runner = EmbeddedRunner(
        KernelContext(agent.profile), model, SupportStoreBackend(), commit=commits
    )
    return runner.run(new_record(budget)), commits


def kinds(rows: list[ChainRow]) -> list[tuple[str, str | None]]:
    return [(r.kind.value, r.outcome) for r in rows]


def test_a_closing_report_runs_in_finalizing_and_is_charged_to_the_reserve() -> None:
    out, commits = run(reporting())
    rec, rows = out.record, out.rows
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_STEPS
    assert rec.closing_report and "max_steps" in rec.closing_report, "the report came back"
    # FINALIZING is observable: a committed version rests in it while the closing call runs.
    assert S.FINALIZING in [r.state for r in commits.records]
    stop_at = next(
        i for i, r in enumerate(rows) if (r.kind, r.outcome) == (RowKind.CONTROL, "finalizing")
    )
    closing = rows[stop_at + 1]
    assert closing.kind is RowKind.MODEL and closing.detail["purpose"] == "closing"
    assert rows[-1].kind is RowKind.STOP and rows[-1].outcome == "max_steps", "then the run ends"
    # The exploration left the reserve untouched; the closing call took its charge from it.
    led = rec.ledger
    charge = Amounts.of(steps=1, tokens=closing.tokens_in + closing.tokens_out)
    for dim in (Dimension.STEPS, Dimension.TOKENS):
        account = led.account(dim)
        assert account.actual - charge.get(dim) <= account.allowance - account.reserve, dim
        assert account.actual <= account.allowance, f"{dim} past budget plus reserve"
    assert charge.get(Dimension.TOKENS) <= REPORT_RESERVE.tokens
    assert led.dollars.actual <= led.dollars.allowance and not led.reservations


def test_without_the_reserve_the_run_could_not_have_paid_for_its_report() -> None:
    # Mutation guard for the test above: the same run with no reserve spends all four steps on
    # exploring, and its closing call is refused as unfunded.
    budget = Budget(max_steps=4, max_tokens=6000)
    out, _ = run(reporting(budget), budget)
    rows = out.rows
    assert ("control", "finalizing") in kinds(rows)
    refused = next(r for r in rows if r.outcome == "finalizing")
    assert refused.detail["closing"] == "not_funded" and "steps" in refused.detail["why"]
    assert out.record.closing_report is None and out.record.turn == 4


def test_an_agent_without_closing_work_passes_through_finalizing_at_once() -> None:
    agent = make_agent(budget=BUDGET)
    out, commits = run(agent)
    assert out.record.stop_reason is StopReason.MAX_STEPS
    assert S.FINALIZING not in [r.state for r in commits.records], "never rests in FINALIZING"
    assert ("control", "finalizing") not in kinds(out.rows)
    assert out.record.closing is None and out.record.turn == 3


def test_a_closing_call_is_given_the_finalize_allowance_and_ends_when_it_runs_out() -> None:
    budget = BUDGET.with_overrides(["finalize_s=1.0"])
    out, _ = run(reporting(budget), budget, latency=1.5)  # every reply takes 1.5 s
    rec = out.record
    closing = rec.closing
    assert closing is not None and closing.until - closing.since == 1.0
    (reply,) = [r for r in out.rows if r.call_id == closing.call_id and r.outcome != "written_off"]
    assert reply.detail["purpose"] == "closing" and reply.detail["timed_out"]
    assert ("control", "closing_failed") in kinds(out.rows)
    assert rec.closing_report is None and rec.state is S.FAILED
    assert reply.at <= closing.until, "the closing call ran within its own allowance"
    # No bill came for it: the reconciler charged its whole reservation, still within budget.
    assert rec.ledger.tokens.actual <= rec.ledger.tokens.allowance and not rec.ledger.reservations


def finalizing_record() -> tuple[TrajectoryRecord, KernelContext, CallModel]:
    """A record resting in FINALIZING with its closing call sent, stepped by hand."""
    budget = Budget(max_steps=2, max_tokens=6000, reserve=REPORT_RESERVE)
    ctx = KernelContext(reporting(budget).profile)
    rec = new_record(budget)
    # Spend the one ordinary step's headroom: admission then stops the run at max_steps.
    rec.ledger.admit("spent", Amounts.of(steps=1))
    rec.ledger.book("spent", Amounts.of(steps=1))
    result = step(rec, Admit(now=5.0), ctx)
    assert result.record.state is S.FINALIZING
    (command,) = result.commands
    assert isinstance(command, CallModel) and command.timeout_s == result.record.budget.finalize_s
    return result.record, ctx, command


def test_a_tick_past_the_allowance_ends_the_run_and_hands_the_call_to_the_reconciler() -> None:
    rec, ctx, call = finalizing_record()
    assert rec.closing is not None
    early = step(rec, Tick(now=rec.closing.until - 0.1), ctx)
    assert early.record is rec, "within its allowance the closing call is waited for"
    late = step(rec, Tick(now=rec.closing.until), ctx)
    done = late.record
    assert done.state is S.FAILED and done.stop_reason is StopReason.MAX_STEPS
    assert [type(c) for c in late.commands] == [CancelCall, Finish]
    op = done.operations[call.call_id]
    assert op.status is OpStatus.UNKNOWN and op.settlement_owner is SettlementOwner.RECONCILER
    assert call.attempt_id in done.ledger.reservations, "withdrawn, never refunded"


def test_a_lost_worker_during_the_closing_call_ends_the_run_on_recovery() -> None:
    rec, ctx, call = finalizing_record()
    out = step(rec, Recover(now=6.0), ctx)
    assert out.record.state is S.FAILED
    assert ("control", "closing_abandoned") in kinds(out.rows)
    assert out.record.operations[call.call_id].settlement_owner is SettlementOwner.RECONCILER


def test_staged_escalation_finalize_stage_runs_the_closing_step() -> None:
    budget = BUDGET.with_overrides(["max_stalls=9", "max_same_error=9"])
    out, _ = run(reporting(budget, Escalation()), budget, policy=new_ids)  # reads until stopped
    outcomes = [r.outcome for r in out.rows if r.kind is RowKind.CONTROL]
    assert "escalation_finalize" in outcomes
    assert outcomes.index("escalation_finalize") < outcomes.index("finalizing")
    assert out.record.escalation == "finalize" and out.record.closing_report


def test_a_closing_report_declared_for_done_is_refused() -> None:
    try:
        ClosingReport(stops=frozenset({StopReason.DONE}))
    except ValueError as exc:
        assert "done" in str(exc)
    else:  # pragma: no cover - the declaration must be refused
        raise AssertionError("a closing report after done was accepted")


def test_random_runs_close_within_the_allowance_and_within_budget_plus_reserve() -> None:
    """1,000 runs of the three loop shapes with closing work, under random clocks, reserves
    and closing allowances: a closing call is sent only in FINALIZING, after the stop, with
    the allowance as its timeout; the run ends within that allowance of the stop; exploring
    never spent the reserve, and the whole run stays within its allowances."""
    rng = random.Random(38_2)
    shapes = {
        LoopShape.REACT: RefundPolicy.from_goal,
        LoopShape.REWOO: RewooRefund.from_goal,
        LoopShape.PLAN_EXECUTE: lambda goal: ReplanningRefund(),
    }
    closed = 0
    for i in range(1_000):
        shape = rng.choice(list(shapes))
        reserve = Amounts.of(steps=1, tokens=rng.choice([0, 300, 1200]))
        budget = Budget(
            max_steps=rng.randint(2, 7),
            max_tokens=6000,
            deadline_s=round(rng.uniform(0.5, 9.0), 2),
            wall_clock_s=round(rng.uniform(0.5, 11.0), 2),
            finalize_s=round(rng.uniform(0.5, 3.0), 2),
            reserve=reserve,
        )
        agent = make_agent(loop=shape, budget=budget, closing=ClosingReport())
        latency = rng.choice([0.5, 1.5, 2.5])
        model = ScriptedModel(shapes[shape](GOAL_1004 if rng.random() < 0.3 else GOAL), latency)
        runner = EmbeddedRunner(KernelContext(agent.profile), model, SupportStoreBackend())
        out = runner.run(new_record(budget))
        rec, rows = out.record, out.rows
        assert rec.state not in LIVE or rec.state is S.AWAITING_APPROVAL, f"run {i}: {rec.state}"
        if rec.state is S.AWAITING_APPROVAL:
            continue
        led, closing = rec.ledger, rec.closing
        # What the closing call was charged is at most its reservation (usage, or written off).
        charge = rec.operations[closing.call_id].reservation if closing else Amounts()
        for dim in Dimension:
            account = led.account(dim)
            assert account.actual <= account.allowance, f"run {i}: {dim} past budget plus reserve"
            explored = account.actual - charge.get(dim)
            assert explored <= account.allowance - account.reserve, f"run {i}: {dim} reserve spent"
        if closing is None:
            # A run stopped at its step limit has the reserve's step and tokens for its report.
            funded = reserve.tokens >= 1200 and rec.stop_reason is StopReason.MAX_STEPS
            assert not funded, f"run {i}: the reserve did not fund the closing call"
            continue
        closed += 1
        calls = [r for r in rows if r.call_id == closing.call_id and r.kind is RowKind.MODEL]
        assert calls and calls[0].detail["purpose"] == "closing", f"run {i}"
        assert calls[0].at <= closing.until + 1e-6, f"run {i}: ran past its allowance"
        assert abs(closing.until - closing.since - budget.finalize_s) < 1e-6, f"run {i}"
    assert closed > 100, f"only {closed} runs closed with a report"
