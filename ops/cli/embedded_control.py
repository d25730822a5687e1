"""``reins approve | deny | pause | resume | cancel | kill | interrupt ID`` without an API: on
the embedded store (``REINS_SQLITE_PATH``), where ``reins run`` keeps its runs.

The stored run goes on in this process with the agent its record names, as far as the kernel
asks (to its end or its next suspension), and is reported as ``reins run`` reports it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kernel.errors import InvalidInput, SnapshotNotFound
from kernel.record import ControlKind, TrajectoryRecord
from kernel.settings import Settings
from ops.cli.agent_run import AgentRun
from ops.cli.report import report
from store.sqlite import SqliteStore
from worker import embedded_control
from worker.embedded import EmbeddedRunner, RunResult

Action = Callable[[EmbeddedRunner, TrajectoryRecord], RunResult]
"""What a command does to the loaded run with its runner."""


def _load(store: SqliteStore, tenant: str, trajectory_id: str) -> TrajectoryRecord:
    try:
        return store.load(tenant, trajectory_id)
    except SnapshotNotFound:
        raise InvalidInput(
            f"{trajectory_id}: no trajectory of tenant {tenant!r} in the embedded store at "
            f"{store.path} (reins run --json prints ids; pass --tenant for another tenant, or set "
            "REINS_API_URL and REINS_API_KEY for a fleet's)",
            code="not_found",
            field="trajectory_id",
        ) from None


def _carry_on(trajectory_id: str, tenant: str, verb: str, as_json: bool, act: Action) -> None:
    """Load the run, build its agent, let ``act`` deliver the event, and report the run."""
    path = Settings.from_env(os.environ).sqlite_path
    if not Path(path).is_file():  # opening would create an empty store: say so instead
        raise InvalidInput(
            f"{trajectory_id}: there is no embedded store at {path} (REINS_SQLITE_PATH) to find "
            "it in; reins run keeps its runs there, or set REINS_API_URL and REINS_API_KEY",
            code="not_found",
            field="trajectory_id",
        )
    store = SqliteStore(path)
    try:
        rec = _load(store, tenant, trajectory_id)
        parts = AgentRun.build(rec.agent, rec.goal, rec.tenant)
        runner = embedded_control.runner_for(
            store, rec, parts.context(), parts.model, parts.tools, parts.bind
        )
        out = act(runner, rec)
        parts.close(out.record)
    finally:
        store.close()
    report(out.record, parts.effects(), f"reins {verb} {trajectory_id}", as_json)


def decide(
    trajectory_id: str,
    tenant: str,
    *,
    approve: bool,
    approval_id: str | None,
    reviewer: str,
    as_json: bool,
) -> None:
    """Approve or deny the request the stored run holds, and carry the run on."""

    def act(runner: EmbeddedRunner, rec: TrajectoryRecord) -> RunResult:
        return embedded_control.decide(
            runner, rec, approve=approve, reviewer=reviewer, approval_id=approval_id
        )

    _carry_on(trajectory_id, tenant, "approve" if approve else "deny", as_json, act)


def control(trajectory_id: str, tenant: str, kind: ControlKind, as_json: bool) -> None:
    """Deliver one control request to the stored run, and carry the run on if it asks."""

    def act(runner: EmbeddedRunner, rec: TrajectoryRecord) -> RunResult:
        return embedded_control.control(runner, rec, kind, requested_by="cli")

    _carry_on(trajectory_id, tenant, kind.value, as_json, act)
