"""Run a stored trajectory: checkpoint before every dispatch, and resume after a crash.

The store hook commits every step by compare-and-set before the runner carries out the
commands it produced, so an operation is in the store as in flight, with its key and its
reservation, before it is sent (register before send). After a crash, :func:`resume` loads
the record and delivers :class:`~kernel.events.Recover`: the kernel re-dispatches under the
same key, or asks the backend for that key's outcome, as each tool declares.
"""

from __future__ import annotations

from collections.abc import Callable

from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.events import Event, Recover
from kernel.record import TrajectoryRecord
from kernel.tools import ToolBackend
from store.base import TrajectoryStore
from worker.embedded import Clock, Commit, EmbeddedRunner, RunResult
from worker.models import Model


def store_commit(store: TrajectoryStore) -> Commit:
    """A runner hook that commits each step by compare-and-set on the previous version."""

    def commit(prev: TrajectoryRecord, new: TrajectoryRecord, rows: list[ChainRow]) -> None:
        store.compare_and_set(new, prev.record_version, rows)

    return commit


def stored_runner(
    store: TrajectoryStore,
    ctx: KernelContext,
    model: Model,
    backend: ToolBackend,
    clock: Clock | None = None,
    bind: Callable[[TrajectoryRecord], ToolBackend] | None = None,
) -> EmbeddedRunner:
    """An embedded runner whose every step is committed to ``store`` before it acts."""
    return EmbeddedRunner(ctx, model, backend, clock=clock, commit=store_commit(store), bind=bind)


def start(
    store: TrajectoryStore,
    rec: TrajectoryRecord,
    ctx: KernelContext,
    model: Model,
    backend: ToolBackend,
    first: Event | None = None,
) -> RunResult:
    """Create the trajectory in the store and run it."""
    store.create(rec)
    return stored_runner(store, ctx, model, backend).run(rec, first)


def resume(
    store: TrajectoryStore,
    tenant: str,
    trajectory_id: str,
    ctx: KernelContext,
    model: Model,
    backend: ToolBackend,
    now: float = 0.0,
    worker: str = "",
) -> RunResult:
    """Load a stranded trajectory and carry on from its record alone."""
    rec = store.load(tenant, trajectory_id)
    runner = stored_runner(store, ctx, model, backend, clock=Clock(max(now, rec.active_s)))
    return runner.run(rec, Recover(now=runner.clock.now(), worker=worker))
