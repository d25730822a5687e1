"""Spans and post-mortems, derived from the execution chain.

The chain is written as a by-product of running, so a trace built from it is complete even
where the model's view was compacted. Span names and attributes follow the OpenTelemetry GenAI
semantic conventions where one exists (``gen_ai.operation.name``, ``gen_ai.usage.*``,
``gen_ai.tool.*``); reins's own attributes carry the ``reins.`` prefix. Arguments are redacted
before they enter a span.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from kernel.chain import ChainRow, RowKind

REDACTED = "[redacted]"
SENSITIVE = frozenset({"email", "card", "card_number", "iban", "ssn", "password", "token", "phone"})


def redact(args: dict[str, Any] | None, sensitive: Iterable[str] = SENSITIVE) -> dict[str, Any]:
    """A copy of ``args`` with sensitive fields replaced, recursively."""
    keys = {k.lower() for k in sensitive}

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: REDACTED if k.lower() in keys else walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(args or {})  # type: ignore[no-any-return]


class Span(BaseModel):
    """One span: task > step > model | tool."""

    model_config = ConfigDict(extra="forbid")

    span_id: str
    parent_id: str | None
    kind: str  # task, step, model, tool
    name: str
    start: float
    end: float
    status: str
    attributes: dict[str, Any] = Field(default_factory=dict)


def spans_from_chain(rows: list[ChainRow], model: str = "") -> list[Span]:
    """Build the span tree of one trajectory from its chain rows (ordered by index)."""
    if not rows:
        return []
    rows = sorted(rows, key=lambda r: r.index)
    first = rows[0]
    task_id = f"{first.trajectory_id}/task"
    stop = next((r for r in reversed(rows) if r.kind is RowKind.STOP), None)
    base = {"reins.tenant": first.tenant, "reins.trajectory_id": first.trajectory_id}
    start = min(r.at - r.duration_s for r in rows)
    spans = [
        Span(
            span_id=task_id,
            parent_id=None,
            kind="task",
            name=f"invoke_agent {first.trajectory_id}",
            start=start,
            end=max(r.at for r in rows),
            status=stop.outcome or "stopped" if stop else "running",
            attributes={**base, "gen_ai.operation.name": "invoke_agent"},
        )
    ]
    steps: dict[int, Span] = {}
    for r in rows:
        if r.kind not in (RowKind.MODEL, RowKind.TOOL):
            continue
        step = steps.get(r.step)
        if step is None:
            step = Span(
                span_id=f"{first.trajectory_id}/step{r.step}",
                parent_id=task_id,
                kind="step",
                name=f"step {r.step}",
                start=r.at - r.duration_s,
                end=r.at,
                status="ok",
                attributes=dict(base),
            )
            steps[r.step] = step
            spans.append(step)
        step.end = max(step.end, r.at)
        name, attrs = call_attributes(r, model)
        status = r.outcome if r.error is None else f"{r.outcome}:{r.error}"
        if status not in ("ok", "COMPLETED"):
            step.status = "error"
        spans.append(
            Span(
                span_id=f"{r.trajectory_id}/{r.index}",
                parent_id=step.span_id,
                kind=r.kind.value,
                name=name,
                start=r.at - r.duration_s,
                end=r.at,
                status=status or "",
                attributes=attrs,
            )
        )
    return spans


def call_attributes(r: ChainRow, model: str = "") -> tuple[str, dict[str, Any]]:
    """The span name and attributes of a model or tool call's chain row ``r`` (GenAI semantic
    conventions, reins's own under ``reins.``); the tool's arguments redacted."""
    base = {"reins.tenant": r.tenant, "reins.trajectory_id": r.trajectory_id}
    attrs: dict[str, Any]
    if r.kind is RowKind.MODEL:
        attrs = {
            **base,
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": r.tokens_in,
            "gen_ai.usage.output_tokens": r.tokens_out,
            "reins.call_id": r.call_id,
            **_overrun(r.detail),
        }
        if (r.detail or {}).get("purpose") == "compaction":  # the scratchpad's summary call
            attrs["reins.purpose"] = "compaction"
            return f"compact {model}".strip(), attrs
        return f"chat {model}".strip(), attrs
    detail = r.detail or {}
    attrs = {
        **base,
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": r.tool,
        "gen_ai.tool.call.id": r.call_id,
        "reins.arguments": redact(r.args),
        "reins.call_key": detail.get("key"),
    }
    return f"execute_tool {r.tool}", attrs


def _overrun(detail: dict[str, Any] | None) -> dict[str, Any]:
    """A model call's usage past its reservation, as span attributes: shown, never hidden."""
    over = (detail or {}).get("overrun") or {}
    return {f"reins.overrun.{k}": v for k, v in over.items() if v not in (0, "0")}


def postmortem(rows: list[ChainRow]) -> dict[str, Any]:
    """First error, most repeated call, model time against tool time, input size by step."""
    rows = sorted(rows, key=lambda r: r.index)
    # A job's log line and a wait for capacity are rows of a call, not calls (nor errors).
    tools = [r for r in rows if r.kind is RowKind.TOOL and r.outcome not in ("progress", "waiting")]
    models = [r for r in rows if r.kind is RowKind.MODEL]
    first_error = next((r for r in tools if r.outcome != "ok"), None)
    calls = Counter((r.tool, json.dumps(r.args, sort_keys=True)) for r in tools)
    stop = next((r for r in reversed(rows) if r.kind is RowKind.STOP), None)
    most = calls.most_common(1)[0] if calls else None
    return {
        "stop": stop.outcome if stop else None,
        "steps": len(models),
        "first_error": [first_error.tool, first_error.error or first_error.outcome]
        if first_error
        else None,
        "most_repeated": [most[0][0], json.loads(most[0][1]), most[1]] if most else None,
        "model_s": round(sum(r.duration_s for r in models), 3),
        "tool_s": round(sum(r.duration_s for r in tools), 3),
        "input_tokens_by_step": [r.tokens_in for r in models],
    }


def render_tree(spans: list[Span]) -> list[str]:
    """The span tree as indented text lines."""
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id, []).append(s)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            extra = ""
            a = s.attributes
            if s.kind == "model":
                extra = (
                    f" in={a['gen_ai.usage.input_tokens']} out={a['gen_ai.usage.output_tokens']}"
                )
            elif s.kind == "tool":
                extra = f" args={json.dumps(a['reins.arguments'], sort_keys=True)}"
            lines.append(
                f"{'  ' * depth}{s.name:<28} {s.start:7.1f} {s.end:7.1f}  {s.status}{extra}"
            )
            walk(s.span_id, depth + 1)

    walk(None, 0)
    return lines
