"""``reins run`` and ``reins demo``: trajectories on the embedded runner."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from typing import Any

import typer
from rich.console import Console

from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.tools import ToolBackend
from ops.cli.report import summary, table
from router.fleet.agents import load_agent
from router.fleet.episodes import write_episode
from router.fleet.memory_config import DAY_MS
from router.process.memory_sweep import sweep_once
from store.memory_sqlite import SqliteMemory
from store.sqlite import SqliteStore
from worker.memory_tools import MemoryBackend, uses_memory
from worker.providers import STREAMED, make_model, with_model
from worker.providers.http import PoolOptions
from worker.recording import RecordingRunner
from worker.resume import store_commit

console = Console()


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
    agent = load_agent(agent_ref)
    limits = agent.profile.budget.with_overrides(budget)
    rec = TrajectoryRecord.create(
        trajectory_id=f"traj-{uuid.uuid4().hex[:8]}",
        tenant=tenant,
        user=user,
        goal=goal,
        agent=agent_ref,
        budget=limits,
        now=0.0,
    )
    backend = agent.make_backend()
    tools: ToolBackend = backend
    memory, bind = None, None
    if uses_memory(agent.profile):  # facts and episodes outlive the run, in the SQLite file
        memory = SqliteMemory.from_settings(Settings.from_env(os.environ))
        tools = MemoryBackend(backend, memory, tenant, agent_ref, time.time, profile=agent.profile)
        bind = tools.bound  # each write judged by the run's record (kernel.memory_policy)
    profile = with_model(
        agent.profile,
        provider=provider,
        base_url=base_url,
        name=model_name,
        api_key_env=api_key_env,
    )
    settings = Settings.from_env(os.environ)
    options: dict[str, Any] = {}
    if profile.model.provider in STREAMED:  # the route's pooled connections, as a worker's
        options["pool_options"] = PoolOptions.from_settings(settings)
    model = make_model(
        profile, agent.make_policy(goal), os.environ, latency_header=latency_header, **options
    )
    commit = None
    if keep:
        store = SqliteStore.from_settings(Settings.from_env(os.environ))
        store.create(rec)
        commit = store_commit(store)
    recorder = RecordingRunner(KernelContext(profile), model, tools, commit=commit, bind=bind)
    out = recorder.start(rec)
    if memory is not None:
        write_episode(memory, out.record, profile, time.time())
        days = Settings.from_env(os.environ).memory_retention_days
        sweep_once(memory, tenant, int(days * DAY_MS), time.time())  # expiry deletes here too
        memory.close()
    if record is not None and recorder.recording is not None:
        recorder.recording.save(record)
    effects = backend.effects() if hasattr(backend, "effects") else []
    result = summary(out.record, effects)
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return
    console.width = max(console.width, 132)
    console.print(table([result], f"reins run {agent_ref}"))
    console.print(result["closing_message"] or f"suspended in {result['state']}")


def register(app: typer.Typer) -> None:
    """Attach ``run`` (and ``demo``) to the CLI."""
    app.command("run")(run_cmd)
    from ops.cli.demo import demo_cmd

    app.command("demo")(demo_cmd)
