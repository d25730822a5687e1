"""Loop shapes that execute a plan without the model: ReWOO and plan-execute-replan.

Both start from a planner reply whose steps carry arguments, with ``#E1`` or ``#E1.field``
references to the results of earlier steps (seed 001 section 2). The kernel runs the steps as
their references resolve, each through the same admission as any tool call; then the model is
called once more to answer (ReWOO's solver) or, under plan-execute-replan, re-entered early when
code detects that an observation broke the plan's assumptions: a tool error, a result that
failed its schema, or an empty result where the plan assumed one. The invariants do not change
with the shape; only who proposes the next call does.
"""

from __future__ import annotations

import re
from typing import Any

from kernel.agent import LoopShape
from kernel.context import Draft
from kernel.dispatch import Call, dispatch
from kernel.lifecycle import Cause
from kernel.record import OpKind, StepStatus, TrajectoryRecord
from kernel.states import LifecycleState

REF = re.compile(r"^#(E\d+)(?:\.(\w+))?$")
EXECUTING = frozenset({LoopShape.REWOO, LoopShape.PLAN_EXECUTE})


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
            step.status = StepStatus.FAILED
            draft.observe({"status": "error", "code": "schema_violation", "detail": why})
            continue
        if spec.needs_approval(clean):
            step.status = StepStatus.FAILED
            draft.observe(
                {
                    "status": "error",
                    "code": "needs_review",
                    "step": step.id,
                    "dispatch_status": "not_sent",
                }
            )
            continue
        ready.append((spec, clean, step.id))
    waiting = any(op.kind is OpKind.TOOL and op.eligible for op in rec.operations.values())
    if ready:
        in_wait = rec.state is LifecycleState.WAITING_TOOL
        dispatch(draft, ready[: rec.budget.max_fanout], None if in_wait else Cause.REPLY_TOOLS)
    elif not waiting:
        in_wait = rec.state is LifecycleState.WAITING_TOOL
        draft.end_turn(Cause.WAIT_SATISFIED if in_wait else Cause.REPLY_OBSERVE)


def triggered(draft: Draft, result: dict[str, Any]) -> bool:
    """Plan-execute-replan's re-entry trigger, decided in code: an error, or an empty result."""
    if draft.ctx.agent.loop is not LoopShape.PLAN_EXECUTE:
        return False
    if result.get("status") != "ok":
        return True
    return not any(k not in ("status", "attempt") for k in result)


def reenter_planner(draft: Draft, result: dict[str, Any]) -> None:
    """Stop executing the plan and return to the model with what broke the assumption."""
    rec = draft.rec
    for op in rec.operations.values():  # later steps' results no longer belong to this plan
        if op.kind is OpKind.TOOL and op.eligible:
            op.eligible = False
    draft.observe({"status": "error", "code": "replan", "cause": result})
    draft.end_turn(Cause.WAIT_SATISFIED)
