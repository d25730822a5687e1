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
    happened: dict[str, str] = {}  # write tool -> outcome ("ok", "unknown")
    for op in rec.operations.values():
        if op.kind is not OpKind.TOOL or op.tool is None:
            continue
        spec = catalog.get(op.tool)
        if spec is None or spec.kind is not ToolKind.WRITE:
            continue
        outcome = (op.evidence or {}).get("status")
        if op.status is OpStatus.SETTLED and outcome == "ok":
            happened[op.tool] = "ok"
        elif op.status is OpStatus.UNKNOWN or outcome == "unknown":
            happened.setdefault(op.tool, "unknown")
    writes = [s.tool for s in rec.plan if _is_write(catalog, s.tool)]
    for tool in happened:
        if tool not in writes:
            writes.append(tool)
    parts: list[str] = []
    for tool in dict.fromkeys(writes):
        spec = catalog.get(tool)
        done = (spec.done_text if spec else "") or f"{tool} succeeded"
        not_done = (spec.not_done_text if spec else "") or f"{tool} was not carried out"
        state = happened.get(tool)
        if state == "ok":
            parts.append(done)
        elif state == "unknown":
            parts.append(f"whether {tool} took effect is not known yet")
        else:
            parts.append(not_done)
    why = WHY[stop]
    return f"{why}: " + "; ".join(parts) + "." if parts else f"{why}."


def _is_write(catalog: Catalog, tool: str) -> bool:
    spec = catalog.get(tool)
    return spec is not None and spec.kind is ToolKind.WRITE
