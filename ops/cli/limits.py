"""``reins limits report`` and ``reins limits trial``: choosing limits from evidence.

``report`` reads finished runs (a CSV or JSONL of outcomes, the embedded store, the fleet's
Redis store or its API) and prints, per budget dimension, the percentiles of accepted runs and
each candidate cap's cut-off rate, accepted count, cost per accepted task and its error: post-hoc
estimates. ``trial`` runs an agent over a task set under each candidate cap and prints the same
figures from the real runs. The arithmetic is in :mod:`ops.limits.stats`.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kernel.errors import InvalidInput
from kernel.settings import Settings
from ops.limits.plot import terminal_lines, write_picture, write_trial_picture
from ops.limits.sources import Filter, from_api, from_store, read_outcomes
from ops.limits.stats import POST_HOC, Dim, DimensionReport, RunOutcome, parse_caps, report
from ops.limits.trial import CandidateFigures, Task, read_tasks, summaries, trial
from router.fleet.agents import load_agent

limits_app = typer.Typer(no_args_is_help=True, help="Choose budget limits from evidence.")
console = Console()

CAPS = typer.Option([], "--caps", help="candidate caps, NAME=V1,V2,... (repeatable)")
TARGET = typer.Option(0.03, "--target-rse", help="the relative standard error to size for")
AS_JSON = typer.Option(False, "--json", help="print one JSON object")
PLOT = typer.Option(None, "--plot", help="write the picture to FILE (.svg or .png)")


def _source(
    path: Path | None, store: str | None, tenant: str, keep: Filter
) -> tuple[str, list[RunOutcome]]:
    if path is not None:
        return str(path), read_outcomes(path)
    settings = Settings.from_env(os.environ)
    if store == "sqlite":
        from store.sqlite import SqliteStore

        return settings.sqlite_path, from_store(SqliteStore.from_settings(settings), tenant, keep)
    if store == "redis":
        from store.redis_store import RedisStore

        rstore = RedisStore.from_settings(settings)
        return f"redis {settings.redis_url}", from_store(rstore, tenant, keep)
    if store == "api":
        from ops.cli.api_target import connected

        with connected() as client:
            return "the fleet's API", from_api(_pages(client), keep)
    raise InvalidInput("name a source: --from FILE, or --store sqlite|redis|api")


def _pages(client: Any) -> Iterator[Mapping[str, Any]]:
    cursor = None
    while True:
        page = client.trajectories(None, 200, cursor)
        yield page
        cursor = page.get("next_cursor")
        if not cursor:
            return


@limits_app.command("report")
def report_cmd(
    path: Path | None = typer.Option(  # noqa: B008 - typer's idiom
        None, "--from", help="a CSV or JSONL file of outcomes"
    ),
    store: str | None = typer.Option(
        None, "--store", help="read a store instead: sqlite (embedded), redis (fleet), api"
    ),
    tenant: str = typer.Option("default", "--tenant", help="the tenant, for --store"),
    agent: str | None = typer.Option(None, "--agent", help="only runs of this MODULE:AGENT"),
    since: float | None = typer.Option(None, "--since", help="submitted at or after (epoch s)"),
    until: float | None = typer.Option(None, "--until", help="submitted before (epoch s)"),
    caps: list[str] = CAPS,
    target_rse: float = TARGET,
    as_json: bool = AS_JSON,
    plot: Path | None = PLOT,
) -> None:
    """Percentiles of accepted runs and what each candidate cap would have given."""
    if not 0 < target_rse < 1:
        raise InvalidInput(f"--target-rse {target_rse}: give a fraction between 0 and 1")
    wanted = parse_caps(caps)
    where, outcomes = _source(path, store, tenant, Filter(agent, since, until))
    reports = report(outcomes, wanted, target_rse)
    if plot is not None:
        accepted = {d: [o.spend[d] for o in outcomes if o.accepted and d in o.spend] for d in Dim}
        write_picture(plot, reports, accepted, f"reins limits report: {where}")
    if as_json:
        body: dict[str, Any] = {d.value: r.as_json() for d, r in reports.items()}
        body["note"] = POST_HOC
        body["source"] = where
        sys.stdout.write(json.dumps(body, sort_keys=True) + "\n")
        return
    _print_report(where, reports)
    if plot is not None:
        console.print(f"picture: {plot}")


def _print_report(where: str, reports: Mapping[Dim, DimensionReport]) -> None:
    console.print(f"[bold]reins limits report[/]: {where}")
    for dim, rep in reports.items():
        pct = ", ".join(f"{k} {v:g}" for k, v in rep.percentiles.items()) or "none accepted"
        console.print(f"\n[bold]{dim.value}[/]: {rep.accepted} of {rep.runs} accepted; {pct}")
        if not rep.caps:
            continue
        table = Table()
        for col in ("cap", "cut off", "accepted", "per accepted", "rse", "tasks for target"):
            table.add_column(col, justify="right")
        for c in rep.caps:
            table.add_row(
                f"{c.cap:g}",
                "-" if c.cut_off_fraction is None else f"{c.cut_off_fraction:.1%}",
                str(c.accepted),
                "-" if c.cost_per_accepted is None else f"{c.cost_per_accepted:.3f}",
                "-" if c.rse is None else f"{c.rse:.1%}" + (" ~" if c.tie_with_best else ""),
                "-" if c.tasks_for_target_rse is None else str(c.tasks_for_target_rse),
            )
        console.print(table)
        for line in terminal_lines(dim.value, [c.as_json() for c in rep.caps]):
            console.print(line)
    console.print(f"\n[dim]{POST_HOC}[/]")


@limits_app.command("trial")
def trial_cmd(
    agent_ref: str = typer.Argument(..., metavar="MODULE:AGENT", help="the agent to try"),
    tasks_path: Path = typer.Option(  # noqa: B008 - typer's idiom
        ..., "--tasks", help="a JSONL file of tasks ({'goal'})"
    ),
    caps: list[str] = CAPS,
    budget: list[str] = typer.Option(  # noqa: B008 - typer's idiom
        [], "--budget", help="the rest of the budget: --budget max_cost=5 (repeatable)"
    ),
    target_rse: float = TARGET,
    as_json: bool = AS_JSON,
    plot: Path | None = PLOT,
    fleet: bool = typer.Option(
        False, "--fleet", help="run on the fleet through its API (REINS_API_URL, REINS_API_KEY)"
    ),
    timeout_s: float = typer.Option(900.0, "--timeout", help="--fleet: seconds for every run"),
) -> None:
    """Run every task under every candidate cap, on the embedded runner or the fleet, and
    compare the candidates as policies."""
    wanted = parse_caps(caps)
    tasks = read_tasks(tasks_path)
    with Progress(console=console, transient=True, disable=as_json) as bar:
        job = bar.add_task("trial runs", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        if fleet:
            figures = _on_fleet(agent_ref, tasks, wanted, budget, timeout_s, progress)
        else:
            agent = load_agent(agent_ref)
            base = agent.profile.budget.with_overrides(budget)
            figures = trial(agent, agent_ref, tasks, wanted, base, progress)
    rows = summaries(figures, target_rse)
    if plot is not None:
        write_trial_picture(plot, rows, f"reins limits trial: {agent_ref}, {len(tasks)} tasks")
    if as_json:
        out = {"agent": agent_ref, "tasks": len(tasks), "candidates": rows}
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return
    _print_trial(agent_ref, len(tasks), rows)
    if plot is not None:
        console.print(f"picture: {plot}")


def _on_fleet(
    agent_ref: str,
    tasks: Sequence[Task],
    caps: Mapping[Dim, Sequence[float]],
    budget: Sequence[str],
    timeout_s: float,
    progress: Callable[[int, int], None],
) -> list[CandidateFigures]:
    from ops.cli.api_target import connected
    from ops.limits.fleet import fleet_trial, parse_overrides

    base = parse_overrides(budget)
    run_id = f"trial-{uuid.uuid4().hex[:8]}"
    with connected() as client:
        return fleet_trial(
            client,
            agent_ref,
            tasks,
            caps,
            base,
            run_id=run_id,
            timeout_s=timeout_s,
            progress=progress,
        )


def _print_trial(agent_ref: str, n: int, rows: Sequence[Mapping[str, Any]]) -> None:
    table = Table(title=f"reins limits trial: {agent_ref}, {n} tasks per candidate")
    for col in (
        "cap",
        "accepted",
        "total $",
        "$ per accepted",
        "rse",
        "unresolved",
        "approvals",
        "wall s (mean)",
        "stops",
    ):
        table.add_column(col, justify="right" if col != "stops" else "left")
    for r in rows:
        cpa = r["cost_per_accepted"]
        table.add_row(
            f"{r['dimension']}={r['cap']:g}",
            f"{r['accepted']}/{r['tasks']}",
            f"{r['total_dollars']:.4f}",
            "-" if cpa is None else f"{cpa:.4f}",
            "-" if r["rse"] is None else f"{r['rse']:.1%}",
            f"{r['unresolved_runs']} (${r['unresolved_dollars']:.4f})",
            str(r["approvals_asked"]),
            f"{r['wall_clock_s_mean']:.1f}",
            ", ".join(f"{k} {v}" for k, v in r["stop_reasons"].items()),
        )
    console.print(table)
    for dim in dict.fromkeys(r["dimension"] for r in rows):
        group = [r for r in rows if r["dimension"] == dim]
        for line in terminal_lines(f"{dim} cap", group, unit="$"):
            console.print(line)
    console.print("[dim]measured: every task ran under each candidate as a policy[/]")


def register(app: typer.Typer) -> None:
    """Attach ``limits`` to the CLI."""
    app.add_typer(limits_app, name="limits")
