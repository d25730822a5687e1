"""Committing a step: the compare-and-set every process writes a record with, and its retry.

:func:`commit` writes one step's result over the record it was stepped on; :func:`advance`
is the whole loop a writer runs (step the event, commit, and on a lost race reload, step again).
The router's admission and API, its reconciler and the worker's turns all write this way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernel.chain import RowKind
from kernel.context import KernelContext, StepResult
from kernel.errors import ConcurrentModification, ControlFlow, InvalidInput, StoreError
from kernel.events import Event
from kernel.record import TrajectoryRecord
from kernel.step import step
from router.fleet.observe import NO_PROVIDER, CommitObserver
from store.base import TrajectoryStore

#: Compare-and-sets lost in a row before a writer gives up (and leaves it to a sweep).
MAX_COMMIT_ATTEMPTS = 16


def commit(
    store: TrajectoryStore,
    rec: TrajectoryRecord,
    result: StepResult,
    observer: CommitObserver,
    provider: str = NO_PROVIDER,
    cas: Callable[[], object] | None = None,
) -> None:
    """Compare-and-set ``result`` over ``rec`` and report it to ``observer`` (``provider``
    made its model calls); raises :class:`ConcurrentModification` (reported as a conflict)
    when another writer won. ``cas`` replaces the store's plain compare-and-set with one of
    its variants."""
    try:
        if cas is None:
            store.compare_and_set(result.record, rec.record_version, result.rows)
        else:
            cas()
    except ConcurrentModification:
        observer.on_store_conflict()
        raise
    observer.on_step_result(rec, result, provider)
    tracer = observer.tracer
    if tracer.enabled:
        for row in result.rows:
            if row.kind is RowKind.STOP:
                tracer.stopped(result.record, row)


@dataclass(frozen=True, slots=True)
class Advance:
    """What :func:`advance` did.

    ``record`` is the newest record the writer saw (the one it committed, or the one it found);
    ``result`` is the step taken on it, None when the kernel refused the event (``refusal``
    holds the kernel's error) or ``still`` found the record moved on; ``committed`` is True
    when a new version was written (a step that changed nothing, a duplicate, writes none).
    """

    record: TrajectoryRecord
    result: StepResult | None
    committed: bool = False
    refusal: ControlFlow | InvalidInput | None = None


def advance(
    store: TrajectoryStore,
    rec: TrajectoryRecord,
    event: Event,
    ctx: KernelContext,
    observer: CommitObserver,
    provider: str = NO_PROVIDER,
    still: Callable[[TrajectoryRecord], bool] | None = None,
    stepped: StepResult | None = None,
) -> Advance:
    """Step ``event`` on ``rec`` and commit it; on a lost race reload, re-check, step again.

    ``still`` (when given) is checked on every record reloaded after a lost race: False ends
    the loop without writing (the record moved on). ``stepped``: the step of ``event`` on
    ``rec`` already taken, committed as the first attempt. A refusal by the kernel writes
    nothing and is returned, not raised. After :data:`MAX_COMMIT_ATTEMPTS` lost races raises
    :class:`StoreError`; any other error of the store propagates.
    """
    result = stepped
    for _ in range(MAX_COMMIT_ATTEMPTS):
        if result is None:
            try:
                result = step(rec, event, ctx)
            except (ControlFlow, InvalidInput) as refusal:
                return Advance(rec, None, refusal=refusal)
        if result.record is rec:
            return Advance(rec, result)
        try:
            commit(store, rec, result, observer, provider)
        except ConcurrentModification:
            rec, result = store.load(rec.tenant, rec.trajectory_id), None
            if still is not None and not still(rec):
                return Advance(rec, None)
            continue
        return Advance(result.record, result, committed=True)
    raise StoreError(f"{rec.trajectory_id}: lost {MAX_COMMIT_ATTEMPTS} commits in a row")
