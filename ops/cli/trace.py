"""``reins trace`` and ``reins replay``: explain a run, and re-run it without the world."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.errors import InvalidInput, SnapshotNotFound
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.trace import postmortem, render_tree, spans_from_chain
from ops.cli.report import summary
from router.fleet.agents import load_agent
from store.sqlite import SqliteStore
from worker.recording import Recording, ReplayResult, replay

console = Console()


def _replay_file(path: str) -> tuple[Recording, ReplayResult, str]:
    if not Path(path).is_file():
        raise InvalidInput(f"{path}: no such recording file (write one with reins run --record)")
    try:
        recording = Recording.load(path)
    except ValueError as exc:
        raise InvalidInput(f"{path} is not a reins recording: {str(exc).splitlines()[0]}") from None
    initial = TrajectoryRecord.from_json(recording.initial)
    agent = load_agent(initial.agent)
    return recording, replay(recording, KernelContext(agent.profile)), agent.profile.model.name


def _stored(trajectory_id: str, tenant: str) -> tuple[TrajectoryRecord, list[ChainRow], str]:
    store = SqliteStore.from_settings(Settings.from_env(os.environ))
    try:
        rec = store.load(tenant, trajectory_id)
    except SnapshotNotFound:
        raise InvalidInput(
            f"{trajectory_id}: neither a recording file nor a trajectory of tenant {tenant!r} "
            "in the embedded store (see reins run --json for ids, or pass --tenant)"
        ) from None
    model = load_agent(rec.agent).profile.model.name
    return rec, store.read(tenant, trajectory_id), model


def trace_cmd(
    source: str = typer.Argument(
        ..., metavar="FILE_OR_ID", help="a recording file, or a trajectory id in the store"
    ),
    tenant: str = typer.Option("default", "--tenant", help="the tenant of a stored trajectory"),
    as_json: bool = typer.Option(False, "--json", help="print spans and post-mortem as JSON"),
) -> None:
    """Print the span tree and the post-mortem of a recorded or stored run."""
    if Path(source).is_file():
        _, result, model = _replay_file(source)
        rec, rows = result.record, result.rows
    else:
        rec, rows, model = _stored(source, tenant)
    spans = spans_from_chain(rows, model=model)
    pm = postmortem(rows)
    if as_json:
        body = {"spans": [s.model_dump() for s in spans], "postmortem": pm}
        sys.stdout.write(json.dumps(body, sort_keys=True) + "\n")
        return
    console.width = max(console.width, 132)
    console.print(f"[bold]trace of {rec.trajectory_id}[/]  (simulated seconds)")
    for line in render_tree(spans):
        console.print(line, markup=False, highlight=False)
    console.print("\n[bold]post-mortem[/]")
    for key, value in pm.items():
        console.print(f"  {key:24} {json.dumps(value)}", markup=False, highlight=False)


def replay_cmd(
    source: str = typer.Argument(..., metavar="FILE", help="a recording written by reins run"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Re-run a recorded trajectory through the kernel with no model and no tool called."""
    recording, result, _ = _replay_file(source)
    final = result.record.to_json().decode()
    out = {
        **summary(result.record),
        "identical_to_recorded": recording.final is not None and final == recording.final,
        "diverged": result.diverged,
    }
    if as_json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
        return
    same = "[green]identical[/]" if out["identical_to_recorded"] else "[red]differs[/]"
    console.print(
        f"replayed {out['trajectory_id']}: {out['state']} {out['stop_reason']}; "
        f"final record {same} to the recorded one"
    )
    if result.diverged:
        console.print(f"[yellow]diverged:[/] {result.diverged}")


def register(app: typer.Typer) -> None:
    """Attach ``trace`` and ``replay``."""
    app.command("trace")(trace_cmd)
    app.command("replay")(replay_cmd)
