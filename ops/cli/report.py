"""How a run is reported: one JSON object, or a readable table."""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.table import Table

from kernel.record import ApprovalStatus, TrajectoryRecord
from kernel.states import LifecycleState


def summary(rec: TrajectoryRecord, effects: list[Any] | None = None) -> dict[str, Any]:
    """The figures of one run, as JSON-ready data."""
    led = rec.ledger
    return {
        "trajectory_id": rec.trajectory_id,
        "tenant": rec.tenant,
        "state": rec.state.value,
        "stop_reason": rec.stop_reason.value if rec.stop_reason else None,
        "steps": rec.turn,
        "tool_calls": rec.tool_dispatches,
        "tokens": led.tokens.actual,
        "cost_usd": str(led.dollars.actual),
        "reserved_usd": str(led.dollars.reserved),
        "active_s": rec.active_s,
        "effects": effects if effects is not None else [],
        "closing_message": rec.closing_message,
        "closing_report": rec.closing_report,
        "held_approval": rec.held.approval_id
        if rec.held and rec.held.status is ApprovalStatus.HELD
        else None,
    }


def table(rows: list[dict[str, Any]], title: str) -> Table:
    """A table of run summaries, one row per trajectory."""
    t = Table(title=title, show_lines=False, pad_edge=False)
    for col in (
        "trajectory",
        "state",
        "stop",
        "steps",
        "tools",
        "tokens",
        "cost $",
        "secs",
        "effects",
    ):
        numeric = col in {"steps", "tools", "tokens", "cost $", "secs"}
        t.add_column(col, justify="right" if numeric else "left", no_wrap=col != "effects")
    for r in rows:
        t.add_row(
            r["trajectory_id"],
            r["state"],
            r["stop_reason"] or "-",
            str(r["steps"]),
            str(r["tool_calls"]),
            str(r["tokens"]),
            f"{Decimal(r['cost_usd']):.4f}",
            f"{r['active_s']:.1f}",
            effects_text(r["effects"]),
        )
    return t


def effects_text(effects: list[Any]) -> str:
    """Effects in a few words: "refund 3000 + email"."""
    words = [" ".join(str(x) for x in e if not str(x).startswith("ord_")) for e in effects]
    return " + ".join(words) or "-"


def report(rec: TrajectoryRecord, effects: list[Any], title: str, as_json: bool) -> None:
    """Print how a run on the embedded runner stopped: its summary as one JSON object, or its
    table and closing message, or what it is suspended in and how to carry it on."""
    result = summary(rec, effects)
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return
    console = Console(width=max(Console().width, 132))
    console.print(table([result], title))
    if result["closing_message"]:
        console.print(result["closing_message"])
        if result["closing_report"]:
            console.print(f"closing report: {result['closing_report']}", markup=False)
        return
    console.print(f"suspended in {result['state']}")
    tid = rec.trajectory_id + ("" if rec.tenant == "default" else f" --tenant {rec.tenant}")
    if result["held_approval"] and rec.held is not None:
        console.print(f"held: {rec.held.tool} {json.dumps(rec.held.args)}", markup=False)
        console.print(f"next: reins approve {tid}  (or reins deny {tid})")
    elif rec.state is LifecycleState.PAUSED:
        console.print(f"next: reins resume {tid}  (or reins cancel {tid})")
