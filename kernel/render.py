"""What the model is shown: a view of the state, not the transcript."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kernel.jsontext import sorted_text
from kernel.record import OpKind, PlanStep, TrajectoryRecord
from kernel.scratchpad import history

Estimator = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """Seed 000's rough estimate: four characters a token, rounded up."""
    return (len(text) + 3) // 4


def render(rec: TrajectoryRecord, closing: dict[str, Any] | None = None) -> str:
    """The model's input: goal, plan with statuses, facts, last observation, remaining budget;
    ``closing``: what the closing step of a stopping run asks (:mod:`kernel.finalizing`)."""
    led = rec.ledger
    view: dict[str, Any] = {
        "goal": rec.goal,
        "plan": [_step_view(s) for s in rec.plan],
        "facts": rec.facts,
        "last_result": rec.last_observation,
        "remaining": {
            "steps": led.steps.allowance - led.steps.actual - led.steps.reserved,
            "tool_calls": led.tool_calls.allowance
            - led.tool_calls.actual
            - led.tool_calls.reserved,
            "tokens": led.tokens.allowance - led.tokens.actual - led.tokens.reserved,
        },
    }
    if rec.scratchpad is not None:
        view["history"] = history(rec.scratchpad)
    if rec.episodes:
        view["earlier_runs"] = rec.episodes
    if rec.escalation is not None:
        view["budget_notice"] = {
            "stage": rec.escalation,
            "ask": "the budget is nearly spent: take a smaller step or give your final report",
            "read_only": rec.grants.read_only,
        }
    if any(s.args is not None for s in rec.plan):
        # An executed plan (ReWOO, plan-execute): the answer call sees every step's evidence.
        view["evidence"] = {
            op.plan_step: {k: v for k, v in op.evidence.items() if k != "attempt"}
            for op in rec.operations.values()
            if op.plan_step is not None
            and op.evidence is not None
            and op.kind is OpKind.TOOL
            and op.epoch == rec.control_epoch
        }
    if closing is not None:
        view["closing"] = closing
    return sorted_text(view)


def _step_view(step: PlanStep) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": step.id,
        "tool": step.tool,
        "depends_on": step.depends_on,
        "status": step.status,  # a str enum: it encodes as its value
    }
    if step.args is not None:
        view["args"] = step.args
    return view


def bound_result(
    result: dict[str, Any], handle: str, max_tokens: int, estimator: Estimator
) -> dict[str, Any]:
    """A result over ``max_tokens`` becomes a handle plus a summary built from its fields.

    The summary keeps scalar fields that are short, and the size of every long one, so the model
    can still act on status codes and ids without the bulk.
    """
    text = sorted_text(result)
    size = estimator(text)
    if size <= max_tokens:
        return result
    summary: dict[str, Any] = {}
    for key, value in sorted(result.items()):
        if (
            isinstance(value, bool | int | float)
            or value is None
            or (isinstance(value, str) and len(value) <= 80)
        ):
            summary[key] = value
        else:
            summary[key] = {"omitted_tokens": estimator(json.dumps(value))}
    return {"handle": handle, "tokens": size, "summary": summary}


#: What a model reached over a protocol is told once per call, before the view (the providers
#: send it as the system message); the kernel's reservation counts it.
SYSTEM_PROMPT = (
    "You act for a reins agent. Each user message is a JSON view of the task: goal, plan with "
    "step statuses, facts, last_result and the remaining budget. Answer in exactly one way: "
    "call one or more tools (set plan_step to the id of the plan step a call carries out); or "
    'reply with a JSON object only: {"type": "plan", "steps": [{"id": ..., "tool": ..., '
    '"depends_on": [...]}]} to set a plan, or {"type": "final", "outcome": "completed", '
    '"text": ...} when the task is done.'
)
