"""Loop shapes that execute a plan without the model: ReWOO and plan-execute-replan.

Both start from a planner reply whose steps carry arguments, with ``#E1`` or ``#E1.field``
references to the results of earlier steps (seed 001 section 2). The kernel runs the steps as
their references resolve, each through the same admission as any tool call; then the model is
called once more to answer (ReWOO's solver) or, under plan-execute-replan, re-entered early when
code detects that an observation broke the plan's assumptions: a tool error, an empty result
where the plan assumed one, a result that fails its tool's declared schema or range, or a step
whose arguments, once its references resolved, fail the tool's schema. Re-planning is bounded
(:func:`replan_bound`); past the bound the run stops and says why.

A step whose resolved call needs approval is not sent and not failed: the plan runs on around
it, and once nothing is in flight the turn ends with the call shown to the model as awaiting
review. The model re-proposes it (naming the plan step), and that reply holds it for a reviewer
exactly as any proposal (AWAITING_APPROVAL is entered from a model reply, seed 004 table 3); the
approved call's result carries the plan on. The invariants do not change with the shape; only
who proposes the next call does.
"""

from __future__ import annotations

import re
from typing import Any

from kernel.agent import LoopShape
from kernel.context import Draft
from kernel.dispatch import Call, dispatch
from kernel.lifecycle import Cause
from kernel.record import Operation, OpKind, PlanStep, StepStatus, TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from kernel.tools import ToolSpec

REF = re.compile(r"^#(E\d+)(?:\.(\w+))?$")
EXECUTING = frozenset({LoopShape.REWOO, LoopShape.PLAN_EXECUTE})
#: Plans plan-execute-replan accepts after its first when the budget names no bound.
DEFAULT_REPLANS = 2


def replan_bound(draft: Draft) -> int:
    """Plans accepted after the first: the budget's ``max_replans``, or when it names none,
    the loop shape's own (:data:`DEFAULT_REPLANS` under plan-execute-replan, else none)."""
    bound = draft.rec.budget.max_replans
    if bound is not None:
        return bound
    return DEFAULT_REPLANS if draft.ctx.agent.loop is LoopShape.PLAN_EXECUTE else 0


def executes_plans(draft: Draft) -> bool:
    """True when the agent's loop shape runs plans without the model."""
    return draft.ctx.agent.loop in EXECUTING


def references(args: Any) -> set[str]:
    """The step ids an argument structure refers to."""
    found: set[str] = set()
    if isinstance(args, dict):
        for v in args.values():
            found |= references(v)
    elif isinstance(args, list):
        for v in args:
            found |= references(v)
    elif isinstance(args, str) and (m := REF.match(args)):
        found.add(m.group(1))
    return found


def reference_problems(steps: list[dict[str, Any]]) -> list[str]:
    """Each reference must name an earlier step; each step of an executed plan needs args."""
    problems, seen = [], set()
    for s in steps:
        sid = s.get("id")
        if not isinstance(s.get("args"), dict):
            problems.append(f"{sid}: an executed plan step needs its arguments")
        for ref in sorted(references(s.get("args"))):
            if ref not in seen:
                problems.append(f"{sid}: refers to #{ref}, which is not an earlier step")
        seen.add(sid)
    return problems


def _results(rec: TrajectoryRecord) -> dict[str, dict[str, Any]]:
    """Results of this plan's steps; a revision advances the epoch, so older ones drop out."""
    out: dict[str, dict[str, Any]] = {}
    for op in rec.operations.values():
        current = op.epoch == rec.control_epoch
        if current and op.kind is OpKind.TOOL and op.plan_step and op.evidence:
            out[op.plan_step] = op.evidence
    return out


def _resolve(value: Any, results: dict[str, dict[str, Any]]) -> Any:
    if isinstance(value, dict):
        return {k: _resolve(v, results) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, results) for v in value]
    if isinstance(value, str) and (m := REF.match(value)):
        result = results[m.group(1)]
        if m.group(2) is None:
            return {k: v for k, v in result.items() if k != "attempt"}
        return result.get(m.group(2))
    return value


def advance(draft: Draft) -> None:
    """Run the plan's next steps whose references resolved; end the wait when none remain."""
    rec, catalog = draft.rec, draft.ctx.agent.catalog
    results = _results(rec)
    busy = {
        op.plan_step
        for op in rec.operations.values()
        if op.kind is OpKind.TOOL and op.open and op.epoch == rec.control_epoch
    }
    done = {s.id for s in rec.plan if s.status is StepStatus.DONE}
    failed = {s.id for s in rec.plan if s.status is StepStatus.FAILED}
    ready: list[Call] = []
    review: dict[str, Any] | None = None  # the first resolved call that needs approval
    for step in draft.own_plan():
        if step.status is not StepStatus.PENDING or step.id in busy or step.id in results:
            continue
        needs = set(step.depends_on) | references(step.args)
        if needs & failed:
            step.status = StepStatus.FAILED  # its inputs never arrived; the solver is told
            failed.add(step.id)
            continue
        if not needs <= done:
            continue
        spec = catalog.get(step.tool)
        args = _resolve(step.args or {}, results)
        clean, why = spec.validate_args(args) if spec else (None, f"unknown tool {step.tool}")
        if clean is None or spec is None:
            if _arguments_broke(draft, step, why):
                return
            continue
        if spec.needs_approval(clean):
            review = review or {"name": spec.name, "args": clean, "plan_step": step.id}
            continue  # held once the model proposes it (module docstring)
        ready.append((spec, clean, step.id))
    _send_or_end(draft, ready, review)


def _send_or_end(draft: Draft, ready: list[Call], review: dict[str, Any] | None) -> None:
    """Send the steps ready now; with none ready and none in flight, the wait ends (showing the
    model a step's call that awaits review, if one does)."""
    rec = draft.rec
    in_wait = rec.state is LifecycleState.WAITING_TOOL
    if ready:
        dispatch(draft, ready[: rec.budget.max_fanout], None if in_wait else Cause.REPLY_TOOLS)
        return
    if any(op.kind is OpKind.TOOL and op.eligible for op in rec.operations.values()):
        return  # results still to come carry the plan on
    if review is not None:
        draft.observe(
            {
                "status": "needs_review",
                "code": "needs_review",
                "call": review,
                "ask": "propose this call, naming its plan_step, to have it reviewed",
                "dispatch_status": "not_sent",
            }
        )
    draft.end_turn(Cause.WAIT_SATISFIED if in_wait else Cause.REPLY_OBSERVE)


def _arguments_broke(draft: Draft, step: PlanStep, why: str | None) -> bool:
    """A step whose arguments fail the tool's schema once resolved: it failed; under
    plan-execute-replan the planner is re-entered (True: the plan stops here)."""
    step.status = StepStatus.FAILED
    broke = {"status": "error", "code": "schema_violation", "step": step.id, "detail": why}
    if replans(draft):  # the plan's arguments broke its assumption: plan anew
        reenter_planner(draft, broke)
        return True
    draft.observe(broke)
    return False


def replans(draft: Draft) -> bool:
    """True when the agent's loop shape re-enters the planner on a broken assumption."""
    return draft.ctx.agent.loop is LoopShape.PLAN_EXECUTE


def result_problem(
    draft: Draft, op: Operation, spec: ToolSpec | None, result: dict[str, Any]
) -> str | None:
    """Why an executed plan's step result breaks its tool's declared schema or range, or
    None (also for a call outside an executed plan, or a tool that declares none)."""
    if spec is None or op.plan_step is None or not executes_plans(draft):
        return None
    return spec.result_problem(result)


def refuse_result(draft: Draft, op: Operation, result: dict[str, Any], problem: str) -> None:
    """A step's result broke its declared schema or range: the step failed (nothing later
    resolves a reference to it); plan-execute-replan plans anew, ReWOO runs on around it."""
    step = draft.own_step(op.plan_step)
    if step is not None:
        step.status = StepStatus.FAILED
    broke = {"status": "error", "code": "result_invalid", "step": op.plan_step, "detail": problem}
    if replans(draft):
        reenter_planner(draft, broke)
        return
    draft.recoverable("result_invalid", broke)
    advance(draft)


def triggered(draft: Draft, result: dict[str, Any]) -> bool:
    """Plan-execute-replan's re-entry trigger, decided in code: an error, or an empty result."""
    if draft.ctx.agent.loop is not LoopShape.PLAN_EXECUTE:
        return False
    if result.get("status") != "ok":
        return True
    return not any(k not in ("status", "attempt") for k in result)


def reenter_planner(draft: Draft, result: dict[str, Any]) -> None:
    """Stop executing the plan and return to the model with what broke the assumption; past
    the re-plan bound, stop the run instead and say why."""
    rec = draft.rec
    for op in rec.operations.values():  # later steps' results no longer belong to this plan
        if op.kind is OpKind.TOOL and op.eligible:
            op.eligible = False
    used, bound = rec.plan_revision - 1, replan_bound(draft)
    if used >= bound:
        what = result.get("code") or result.get("status")
        why = f"the plan broke ({what} at step {result.get('step', '?')})"
        draft.stop(StopReason.FAILED, f"{why}, and no re-plan is left (max_replans {bound})")
        return
    draft.observe(
        {"status": "error", "code": "replan", "cause": result, "replans_left": bound - used}
    )
    in_wait = rec.state is LifecycleState.WAITING_TOOL
    draft.end_turn(Cause.WAIT_SATISFIED if in_wait else Cause.REPLY_OBSERVE)
