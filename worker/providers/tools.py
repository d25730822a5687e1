"""Tools in the provider's format, and tool calls back into the kernel's proposal shape.

The tool declarations of the agent (``ToolSpec``) are exported as OpenAI ``tools`` entries (or
Anthropic's, the same schema as ``input_schema``):
the argument schema is the spec's own JSON schema, plus an optional ``plan_step`` argument so a
model can say which plan step a call carries out (the kernel keys idempotency by plan step).

Going back, nothing is repaired or guessed: arguments that are not valid JSON are passed on as
the raw string, so the kernel's schema check turns them into a recoverable ``schema_violation``
observation; an unknown tool name is passed on so the catalog check observes ``unknown_tool``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kernel.tools import PLAN_STEP, ToolSpec, wire_tools


def openai_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The specs as chat-completions ``tools`` (``{"type": "function", "function": ...}``):
    the kernel's wire form (:func:`kernel.tools.wire_tools`), which its reservation counts."""
    return wire_tools(specs)


def anthropic_tools(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The specs as Anthropic Messages ``tools`` (``{"name", "description", "input_schema"}``),
    with the same schemas as :func:`openai_tools`."""
    out: list[dict[str, Any]] = []
    for tool in openai_tools(specs):
        function = tool["function"]
        entry = {"name": function["name"], "input_schema": function["parameters"]}
        if "description" in function:
            entry["description"] = function["description"]
        out.append(entry)
    return out


def own_plan_step(specs: Iterable[ToolSpec]) -> frozenset[str]:
    """Tools whose own arguments include ``plan_step`` (it is theirs: never taken out)."""
    return frozenset(
        s.name for s in specs if PLAN_STEP in (s.json_schema().get("properties") or {})
    )


@dataclass(frozen=True)
class ToolCallText:
    """One tool call as the provider streamed it: a name and an arguments text."""

    name: str
    arguments: str | dict[str, Any]


def parse_arguments(arguments: str | dict[str, Any]) -> Any:
    """The arguments as data, or the raw text when it is not JSON (never repaired)."""
    if isinstance(arguments, dict):  # a server that sends an object instead of a JSON string
        return arguments
    if not arguments.strip():
        return {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def proposal(calls: Sequence[ToolCallText], keep_plan_step: frozenset[str]) -> dict[str, Any]:
    """Tool calls as the kernel's proposal: ``{"type": "tool", ...}`` for one call,
    ``{"type": "tools", "calls": [...]}`` for several."""
    items: list[dict[str, Any]] = []
    for call in calls:
        args = parse_arguments(call.arguments)
        step: Any = None
        if isinstance(args, dict) and call.name not in keep_plan_step and PLAN_STEP in args:
            step = args[PLAN_STEP]
            args = {k: v for k, v in args.items() if k != PLAN_STEP}
        item: dict[str, Any] = {"name": call.name, "args": args}
        if step is not None:
            item[PLAN_STEP] = step
        items.append(item)
    if len(items) == 1:
        return {"type": "tool", **items[0]}
    return {"type": "tools", "calls": items}
