"""The closing message, built from the state by a template; never by a model call."""

from __future__ import annotations

from kernel.record import OpKind, OpStatus, TrajectoryRecord
from kernel.states import StopReason
from kernel.tools import Catalog, ToolKind

WHY = {
    StopReason.DONE: "The request was completed",
    StopReason.MAX_STEPS: "The run stopped at its step limit",
    StopReason.MAX_TOOL_CALLS: "The run stopped at its tool-call limit",
    StopReason.MAX_TOKENS: "The run stopped at its token limit",
    StopReason.MAX_COST: "The run stopped at its cost limit",
    StopReason.DEADLINE: "The run stopped at its time limit",
    StopReason.WALL_CLOCK: "The run stopped at its wall-clock limit",
    StopReason.REPEATED_CALL: "The run stopped because the same call was repeated",
    StopReason.NO_PROGRESS: "The run stopped because it was not making progress",
    StopReason.UNKNOWN_OUTCOME: "The run stopped because an action's outcome is unknown",
    StopReason.CANCELED: "The run was canceled",
    StopReason.KILLED: "The run was killed by an operator",
    StopReason.FAILED: "The run failed",
}


def closing_message(rec: TrajectoryRecord, catalog: Catalog, stop: StopReason) -> str:
    """Say why the run ended and which effects happened, from plan statuses and operations.

    Example: "The run stopped at its step limit: your refund was issued; the confirmation
    email was not sent."
    """
    happened = _write_outcomes(rec, catalog)
    writes = [s.tool for s in rec.plan if _is_write(catalog, s.tool)]
    for tool in happened:
        if tool not in writes:
            writes.append(tool)
    parts = [_effect_phrase(catalog, tool, happened.get(tool)) for tool in dict.fromkeys(writes)]
    why = WHY[stop]
    return f"{why}: " + "; ".join(parts) + "." if parts else f"{why}."


def _write_outcomes(rec: TrajectoryRecord, catalog: Catalog) -> dict[str, str]:
    """Write tool -> "ok" once any of its calls settled ok, else "unknown" if one's outcome is
    not known; a write tool with neither is absent."""
    happened: dict[str, str] = {}
    for op in rec.operations.values():
        if op.kind is not OpKind.TOOL or op.tool is None or not _is_write(catalog, op.tool):
            continue
        outcome = (op.evidence or {}).get("status")
        if op.status is OpStatus.SETTLED and outcome == "ok":
            happened[op.tool] = "ok"
        elif op.status is OpStatus.UNKNOWN or outcome == "unknown":
            happened.setdefault(op.tool, "unknown")
    return happened


def _effect_phrase(catalog: Catalog, tool: str, state: str | None) -> str:
    """The closing message's words for one write tool in ``state`` (see :func:`_write_outcomes`)."""
    spec = catalog.get(tool)
    if state == "ok":
        return (spec.done_text if spec else "") or f"{tool} succeeded"
    if state == "unknown":
        return f"whether {tool} took effect is not known yet"
    return (spec.not_done_text if spec else "") or f"{tool} was not carried out"


def _is_write(catalog: Catalog, tool: str) -> bool:
    spec = catalog.get(tool)
    return spec is not None and spec.kind is ToolKind.WRITE
