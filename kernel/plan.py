"""Validation of a model-proposed plan: cheap, mechanical, one precise reason per problem."""

from __future__ import annotations

from typing import Any

from kernel.fastmodel import construct
from kernel.record import PlanStep, StepStatus
from kernel.tools import Catalog, ToolKind


def validate_plan(steps: Any, catalog: Catalog, max_steps: int) -> list[str]:
    """Problems with a proposed plan; an empty list means it is acceptable.

    Checks: a non-empty list, not too long, unique ids, known tools, dependencies only on
    earlier steps, and every write step has a prerequisite.
    """
    if not isinstance(steps, list) or not steps:
        return ["plan must be a non-empty list of steps"]
    problems: list[str] = []
    if len(steps) > max_steps:
        problems.append(f"too many steps ({len(steps)} > {max_steps})")
    seen: set[str] = set()
    for i, step in enumerate(steps):
        problems += _step_problems(i, step, catalog, seen)
    return problems


def _step_problems(i: int, step: Any, catalog: Catalog, seen: set[str]) -> list[str]:
    """Problems with step ``i``, where ``seen`` holds the ids of the steps before it; a step
    with a string id adds it to ``seen``."""
    if not isinstance(step, dict):
        return [f"step {i}: must be an object with id, tool and depends_on"]
    sid, tool, deps = step.get("id"), step.get("tool"), step.get("depends_on", [])
    label = sid if isinstance(sid, str) and sid else f"step {i}"
    problems: list[str] = []
    if not isinstance(sid, str) or not sid:
        problems.append(f"{label}: id must be a non-empty string")
    elif sid in seen:
        problems.append(f"{sid}: duplicate id")
    spec = catalog.get(tool) if isinstance(tool, str) else None
    if spec is None:
        problems.append(f"{label}: unknown tool {tool!r}")
    is_write = spec is not None and spec.kind is ToolKind.WRITE
    problems += _dependency_problems(label, deps, seen, is_write)
    if isinstance(sid, str):
        seen.add(sid)
    return problems


def _dependency_problems(label: str, deps: Any, seen: set[str], is_write: bool) -> list[str]:
    """Problems with a step's ``depends_on``: a list of ids of earlier steps, not empty for a
    write step."""
    problems: list[str] = []
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        problems.append(f"{label}: depends_on must be a list of step ids")
        deps = []
    for dep in deps:
        if dep not in seen:
            problems.append(f"{label}: depends on {dep!r}, which is not an earlier step")
    if is_write and not deps:
        problems.append(f"{label}: write step has no prerequisite")
    return problems


def adopt(steps: list[dict[str, Any]]) -> list[PlanStep]:
    """The validated plan (:func:`validate_plan` checked every field) as live plan steps,
    every one pending."""
    return [
        construct(
            PlanStep,
            id=s["id"],
            tool=s["tool"],
            depends_on=list(s.get("depends_on", [])),
            args=s.get("args") if isinstance(s.get("args"), dict) else None,
        )
        for s in steps
    ]


def open_steps(plan: list[PlanStep]) -> list[str]:
    """Ids of steps still pending."""
    return [s.id for s in plan if s.status is StepStatus.PENDING]
