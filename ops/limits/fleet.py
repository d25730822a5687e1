"""``reins limits trial --fleet``: the trial of :mod:`ops.limits.trial` on the fleet, through its
API, as the tenant of the key.

Every task of every candidate is submitted at once (the fleet runs them side by side, under the
fair share the tenant has), with the candidate's cap as a budget override; then each is followed
until it ends, and a held action is decided as the task says, by the key's principal. Wall-clock
time is measured from submission to the first poll that sees the run ended. A task that names a
``backend`` environment is refused: the fleet's workers build their own tool backend.

Every candidate acts on the fleet's one backend: a task's writes under one cap change the world
the same task meets under the next (an order refunded under the first cap may have nothing left
to refund under the second). Give the trial a sandbox backend, or tasks whose writes leave room
for every candidate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kernel.errors import InvalidInput
from ops.limits.sources import FINISHED, outcome_of_view
from ops.limits.stats import Dim
from ops.limits.trial import BUDGET_KEYS, MAX_DECISIONS, CandidateFigures, RunFigures, Task

_ENDED = {s.value for s in FINISHED}


class TrialClient(Protocol):
    """What the fleet trial needs of :class:`api.client.ReinsClient`."""

    def submit(self, job: dict[str, Any], *, idempotency_key: str | None = None) -> Any: ...

    def show(self, trajectory_id: str) -> Any: ...

    def decide(
        self, trajectory_id: str, approval_id: str, *, approve: bool, version: int, digest: str
    ) -> Any: ...


def _budget(base: Mapping[str, str], dim: Dim, cap: float) -> dict[str, int | float | str]:
    value: int | float | str = f"{cap:g}" if dim is Dim.DOLLARS else cap
    if dim in (Dim.STEPS, Dim.TOOL_CALLS, Dim.TOKENS):
        value = int(cap)
    return {**base, BUDGET_KEYS[dim]: value}


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``--budget key=value`` pairs as the API's budget overrides."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--budget {pair!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


#: A submitted run: its candidate, its task and when it was submitted.
Submission = tuple[Dim, float, Task, float]


def fleet_trial(
    client: TrialClient,
    agent_ref: str,
    tasks: Sequence[Task],
    caps: Mapping[Dim, Sequence[float]],
    base: Mapping[str, str],
    *,
    run_id: str,
    timeout_s: float = 900.0,
    poll_s: float = 0.25,
    progress: Callable[[int, int], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[CandidateFigures]:
    """Submit every (candidate, task), follow each to its end; figures per candidate."""
    if not caps:
        raise InvalidInput("name the candidate caps: --caps steps=4,6,8")
    for n, task in enumerate(tasks, 1):
        if task.backend:
            raise InvalidInput(
                f"task {n}: a 'backend' environment applies on the embedded runner only; "
                "the fleet's workers build their own"
            )
    candidates = [(d, c) for d in caps for c in sorted(set(caps[d]))]
    runs: dict[str, Submission] = {}
    for dim, cap in candidates:
        for i, task in enumerate(tasks):
            job = {
                "agent": agent_ref,
                "goal": task.goal,
                "user": task.user,
                "budget": _budget(base, dim, cap),
            }
            key = f"{run_id}-{dim.value}-{cap:g}-{i}"  # a retried trial submits nothing twice
            tid = str(client.submit(job, idempotency_key=key)["trajectory_id"])
            runs[tid] = (dim, cap, task, clock())
    ended = _follow(client, runs, clock() + timeout_s, poll_s, progress, clock)
    return [
        CandidateFigures(
            dim, cap, [ended[t] for t, (d, c, _, _) in runs.items() if d is dim and c == cap]
        )
        for dim, cap in candidates
    ]


def _follow(
    client: TrialClient,
    runs: Mapping[str, Submission],
    deadline: float,
    poll_s: float,
    progress: Callable[[int, int], None] | None,
    clock: Callable[[], float],
) -> dict[str, RunFigures]:
    """Poll every run until it ends, deciding held actions as its task says."""
    ended: dict[str, RunFigures] = {}
    decisions: dict[str, int] = dict.fromkeys(runs, 0)
    while True:
        for tid in [t for t in runs if t not in ended]:
            view = client.show(tid)
            if view["state"] in _ENDED:
                ended[tid] = _figures(view, decisions[tid], clock() - runs[tid][3])
                if progress is not None:
                    progress(len(ended), len(runs))
            elif _pending(view) and decisions[tid] < MAX_DECISIONS:
                held = view["held_approval"]
                decisions[tid] += 1
                client.decide(
                    tid,
                    held["approval_id"],
                    approve=runs[tid][2].approve,
                    version=held["version"],
                    digest=held["digest"],
                )
        if len(ended) == len(runs):
            return ended
        if clock() > deadline:
            raise InvalidInput(
                f"{len(runs) - len(ended)} trial runs did not end in time; is the fleet "
                "running (reins up), and are its workers taking turns (reins doctor)?"
            )
        time.sleep(poll_s)  # polling a remote API between rounds


def _pending(view: Mapping[str, Any]) -> bool:
    held = view.get("held_approval") or {}
    return view["state"] == "AWAITING_APPROVAL" and held.get("status") == "held"


def _figures(view: Mapping[str, Any], decisions: int, wall_s: float) -> RunFigures:
    reserved = float(view["budget"]["dollars"]["reserved"])
    return RunFigures(
        outcome=outcome_of_view(view),
        stop_reason=str(view.get("stop_reason") or view["state"]),
        approvals=decisions,
        unresolved_dollars=reserved,
        open_operations=1 if reserved > 0 else 0,
        wall_clock_s=round(wall_s, 3),
    )
