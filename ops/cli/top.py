"""``reins top``: each tenant's share of the admitted charge against its weight, its backlog
and its p99 admission wait, from ``GET /v1/usage``; live with rich until Ctrl-C."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ops.cli.api_target import connected

console = Console()


def usage_table(rows: list[dict[str, Any]]) -> Table:
    """One row per tenant."""
    table = Table(title="reins top")
    for column in ("tenant", "weight", "weight share", "admitted share", "backlog", "p99 wait"):
        table.add_column(column, justify="right")
    for r in rows:
        wait = r["wait_p99_s"]
        table.add_row(
            r["tenant"],
            f"{r['weight']:g}",
            f"{r['weight_share']:.1%}",
            f"{r['admitted_share']:.1%}",
            str(r["backlog"]),
            "-" if wait is None else f"{wait * 1000:.0f} ms",
        )
    return table


def top_cmd(
    once: bool = typer.Option(False, "--once", help="print once and exit"),
    every: float = typer.Option(1.0, "--every", help="seconds between refreshes"),
    as_json: bool = typer.Option(False, "--json", help="print JSON once"),
) -> None:
    """Per-tenant share against weight, backlog and p99 wait (every tenant, operator keys)."""
    with connected() as client:
        if as_json or once:
            rows = client.usage()
            if as_json:
                sys.stdout.write(json.dumps(rows, sort_keys=True) + "\n")
            else:
                console.print(usage_table(rows))
            return
        with Live(usage_table(client.usage()), console=console, refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(every)
                    live.update(usage_table(client.usage()))
            except KeyboardInterrupt:
                return
