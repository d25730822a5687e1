"""``reins run`` and ``reins demo``: trajectories on the embedded runner."""

from __future__ import annotations

import os
import uuid

import typer

from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from ops.cli.agent_run import AgentRun
from ops.cli.report import report
from store.sqlite import SqliteStore
from worker.recording import RecordingRunner
from worker.resume import store_commit


def run_cmd(
    agent_ref: str = typer.Argument(..., metavar="MODULE:AGENT", help="the agent to run"),
    goal: str = typer.Option(..., "--goal", help="what the user asked for"),
    budget: list[str] = typer.Option(  # noqa: B008 - typer's idiom
        [], "--budget", help="override a budget key: --budget max_steps=3 (repeatable)"
    ),
    user: str = typer.Option("cu_ana", "--user", help="the user the run acts for"),
    tenant: str = typer.Option("default", "--tenant", help="the tenant the run belongs to"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    provider: str | None = typer.Option(
        None,
        "--provider",
        help="the model provider instead of the profile's: scripted, openai-compatible or "
        "anthropic",
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="the provider's base URL"),
    model_name: str | None = typer.Option(None, "--model", help="the model name to ask for"),
    api_key_env: str | None = typer.Option(
        None, "--api-key-env", help="the environment variable holding the API key"
    ),
    keep: bool = typer.Option(
        True, "--store/--no-store", help="keep the record and its chain in the embedded store"
    ),
    record: str | None = typer.Option(
        None, "--record", help="write a recording FILE for reins trace and reins replay"
    ),
    latency_header: str | None = typer.Option(
        None,
        "--latency-header",
        help="take each call's latency from this response header in milliseconds "
        "(e.g. openai-processing-ms) instead of measuring wall time",
    ),
) -> None:
    """Run one trajectory on the embedded runner and report how it ended."""
    parts = AgentRun.build(
        agent_ref,
        goal,
        tenant,
        provider=provider,
        base_url=base_url,
        model_name=model_name,
        api_key_env=api_key_env,
        latency_header=latency_header,
    )
    rec = TrajectoryRecord.create(
        trajectory_id=f"traj-{uuid.uuid4().hex[:8]}",
        tenant=tenant,
        user=user,
        goal=goal,
        agent=agent_ref,
        budget=parts.agent.profile.budget.with_overrides(budget),
        now=0.0,
    )
    commit = None
    if keep:
        store = SqliteStore.from_settings(Settings.from_env(os.environ))
        store.create(rec)
        commit = store_commit(store)
    recorder = RecordingRunner(
        parts.context(), parts.model, parts.tools, commit=commit, bind=parts.bind
    )
    out = recorder.start(rec)
    parts.close(out.record)
    if record is not None and recorder.recording is not None:
        recorder.recording.save(record)
    report(out.record, parts.effects(), f"reins run {agent_ref}", as_json)


def register(app: typer.Typer) -> None:
    """Attach ``run`` (and ``demo``) to the CLI."""
    app.command("run")(run_cmd)
    from ops.cli.demo import demo_cmd

    app.command("demo")(demo_cmd)
