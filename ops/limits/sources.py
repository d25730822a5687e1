"""Where ``reins limits report`` reads finished runs: a CSV or JSONL file of outcomes, recordings
(``reins run --record``), a store (the embedded SQLite file, or the fleet's Redis), or the
fleet's API.

Every source yields :class:`ops.limits.stats.RunOutcome` rows. A run counts as accepted when it
stopped ``done``: the kernel stops a run ``done`` only after the agent's declared acceptance
check (``AgentProfile.acceptance``) passed, so that check is already in the stop reason. Bad
input raises :class:`kernel.errors.InvalidInput` naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.errors import InvalidInput, ReinsError
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from ops.limits.stats import COLUMNS, Dim, RunOutcome
from store.base import TrajectoryStore
from worker.recording import Recording

#: The states of finished runs.
FINISHED = (LifecycleState.COMPLETED, LifecycleState.FAILED, LifecycleState.CANCELED)
_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
_PAGE = 500


@dataclass(frozen=True)
class Filter:
    """Which finished runs to read: by agent reference and by submission time (seconds)."""

    agent: str | None = None
    since: float | None = None
    until: float | None = None

    def keeps(self, agent: str, submitted_at: float) -> bool:
        if self.agent is not None and agent != self.agent:
            return False
        if self.since is not None and submitted_at < self.since:
            return False
        return self.until is None or submitted_at < self.until


def outcome_of_record(rec: TrajectoryRecord) -> RunOutcome:
    """A finished record's outcome: accepted if it stopped ``done``; spend from its ledger."""
    led = rec.ledger
    spend = {
        Dim.STEPS: float(led.steps.actual),
        Dim.TOOL_CALLS: float(led.tool_calls.actual),
        Dim.TOKENS: float(led.tokens.actual),
        Dim.DOLLARS: float(led.dollars.actual),
        Dim.ACTIVE_S: float(rec.active_s),
    }
    return RunOutcome(rec.trajectory_id, rec.stop_reason is StopReason.DONE, spend)


def from_store(store: TrajectoryStore, tenant: str, keep: Filter = Filter()) -> list[RunOutcome]:
    """The tenant's finished runs in a store, a page at a time (bounded work per call)."""
    out = []
    for state in FINISHED:
        after = ""
        while True:
            ids = store.page(tenant, state, after, _PAGE)
            for tid in ids:
                rec = store.load(tenant, tid)
                if keep.keeps(rec.agent, rec.submitted_at):
                    out.append(outcome_of_record(rec))
            if len(ids) < _PAGE:
                break
            after = ids[-1]
    return out


def outcome_of_view(view: Mapping[str, Any]) -> RunOutcome:
    """A finished trajectory as the API shows it (``api.views.Trajectory``)."""
    budget = view.get("budget") or {}
    spend = {}
    for dim in (Dim.STEPS, Dim.TOOL_CALLS, Dim.TOKENS, Dim.DOLLARS):
        if dim.value in budget:
            spend[dim] = float(budget[dim.value]["spent"])
    return RunOutcome(str(view["trajectory_id"]), view.get("stop_reason") == "done", spend)


def from_api(pages: Iterator[Mapping[str, Any]], keep: Filter = Filter()) -> list[RunOutcome]:
    """Finished trajectories from the API's pages of trajectory views."""
    out = []
    for page in pages:
        for view in page.get("items", []):
            finished = view.get("state") in {s.value for s in FINISHED}
            if finished and keep.keeps(str(view["agent"]), float(view["submitted_at"])):
                out.append(outcome_of_view(view))
    return out


def read_outcomes(path: Path) -> list[RunOutcome]:
    """A CSV (with a header) or JSONL file of outcomes, by its suffix (``.jsonl``/``.ndjson``
    are JSON lines, anything else CSV). Columns: ``trajectory_id`` (optional), ``accepted``
    (true/false or 1/0), and any of ``steps, tool_calls, tokens, cost_usd, active_s``.
    A ``.json`` file, or a folder of them, is read as recordings (``reins run --record``)."""
    if path.is_dir() or path.suffix == ".json":
        return read_recordings(path)
    if not path.is_file():
        raise InvalidInput(f"{path}: no such file")
    text = path.read_text(encoding="utf-8")
    lines = path.suffix in {".jsonl", ".ndjson"}
    rows = json_lines(path, text) if lines else _csv_rows(path, text)
    return [_outcome(path, n, row) for n, row in rows]


def read_recordings(path: Path) -> list[RunOutcome]:
    """The finished runs among recordings: one ``.json`` file or every one in a folder."""
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    if not files or not files[0].is_file():
        raise InvalidInput(f"{path}: no recordings (reins run --record FILE.json writes one)")
    out = []
    for file in files:
        try:
            recording = Recording.load(file)
            final = TrajectoryRecord.from_json(recording.final) if recording.final else None
        except (ValueError, ReinsError) as exc:
            raise InvalidInput(f"{file}: not a recording of a run ({exc})") from None
        if final is not None and final.state in FINISHED:
            out.append(outcome_of_record(final))
    return out


def json_lines(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSON-lines text with their line numbers; blank lines skipped."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise InvalidInput(f"{path}:{n}: each line must be a JSON object")
        rows.append((n, row))
    return rows


def _csv_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(text.splitlines())
    header = reader.fieldnames or []
    if "accepted" not in header:
        raise InvalidInput(f"{path}: the header must name an 'accepted' column (got {header})")
    if not set(header) & set(COLUMNS.values()):
        raise InvalidInput(
            f"{path}: the header names no dimension; give any of {', '.join(COLUMNS.values())}"
        )
    return [(n, dict(row)) for n, row in enumerate(reader, 2)]


def _outcome(path: Path, n: int, row: Mapping[str, Any]) -> RunOutcome:
    where = f"{path}:{n}"
    accepted = row.get("accepted")
    if isinstance(accepted, bool):
        ok = accepted
    elif str(accepted).strip().lower() in _TRUE:
        ok = True
    elif str(accepted).strip().lower() in _FALSE:
        ok = False
    else:
        raise InvalidInput(f"{where}: accepted must be true/false or 1/0, not {accepted!r}")
    spend = {}
    for dim, column in COLUMNS.items():
        raw = row.get(column)
        if raw is None or raw == "":
            continue
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}: {column} must be a number, not {raw!r}") from None
        if not value >= 0 or value == float("inf"):
            raise InvalidInput(f"{where}: {column} must be a finite number >= 0, not {raw!r}")
        spend[dim] = value
    if not spend:
        raise InvalidInput(f"{where}: no dimension given ({', '.join(COLUMNS.values())})")
    return RunOutcome(str(row.get("trajectory_id") or f"row-{n}"), ok, spend)
