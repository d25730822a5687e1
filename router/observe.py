"""What a router process tells an observer (Prometheus metrics, in ``ops.metrics``).

The dispatch loop and the router service report domain events through these protocols and
never name a metric: the observer is a middleware, passed in at boot, and ``None`` means no
observer at all (each report is then one ``is None`` test). ``ops.metrics.Metrics`` satisfies
:class:`RouterObserver` structurally, so nothing here imports ``ops``.

Contract for every observer: a report never raises into the loop and never blocks on I/O;
it is called from the loop's own thread, after the fact it reports (a commit is reported
only once its compare-and-set succeeded, so a lost race counts as a conflict, not a step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from kernel.context import StepResult
from kernel.errors import ConcurrentModification
from kernel.record import TrajectoryRecord
from router.drr import ReadyCall
from router.fairness import FairnessFigures
from router.membership import MemberRecord
from router.tenants import AdmissionConfig
from store.base import TrajectoryStore

#: The provider of a call that goes through no provider gate.
NO_PROVIDER = "none"


def provider_of(route: str | None) -> str:
    """The provider of a route ``provider/model``; ``none`` for no route."""
    return route.split("/", 1)[0] if route else NO_PROVIDER


class CommitObserver(Protocol):
    """Told of each step a process committed, and of each compare-and-set it lost."""

    def on_step_result(
        self, record: TrajectoryRecord, result: StepResult, provider: str = NO_PROVIDER
    ) -> None:
        """``result`` was committed over ``record``; ``provider`` made its model calls."""
        ...

    def on_store_conflict(self) -> None:
        """A compare-and-set lost to another writer (the loser reloads and re-decides)."""
        ...


class AdmissionObserver(CommitObserver, Protocol):
    """Told what the dispatch loop admitted and what the provider gates refused."""

    def on_admission(self, call: ReadyCall, wait_s: float) -> None:
        """``call`` was admitted (committed and sent) after ``wait_s`` seconds READY."""
        ...

    def on_gate_refused(self, provider: str, gate: str, count: int = 1) -> None:
        """``count`` nominations a gate of ``provider`` refused for ``gate`` (its reason)."""
        ...


class RouterObserver(AdmissionObserver, Protocol):
    """Also told, at boot and at each tick, what the router's configuration and state are."""

    def on_config(self, config: AdmissionConfig) -> None:
        """The tenants this router admits for."""
        ...

    def on_figures(self, figures: FairnessFigures) -> None:
        """The admitter's snapshot (this router admits)."""
        ...

    def forget_figures(self) -> None:
        """This router does not admit now (it stands by for the admitter's lease)."""
        ...

    def on_membership(self, records: Iterable[MemberRecord]) -> None:
        """The ring's membership as read from Redis."""
        ...

    def on_held_approvals(self, held: Mapping[str, int]) -> None:
        """Trajectories held for approval, per tenant."""
        ...


def commit(
    store: TrajectoryStore,
    rec: TrajectoryRecord,
    result: StepResult,
    observer: CommitObserver | None,
    provider: str = NO_PROVIDER,
    cas: Callable[[], object] | None = None,
) -> None:
    """Compare-and-set ``result`` over ``rec`` and report it to ``observer`` (``provider``
    made its model calls); raises :class:`ConcurrentModification` (reported as a conflict)
    when another writer won. Every process that commits a step commits it here; ``cas``
    replaces the store's plain compare-and-set with one of its variants."""
    try:
        if cas is None:
            store.compare_and_set(result.record, rec.record_version, result.rows)
        else:
            cas()
    except ConcurrentModification:
        if observer is not None:
            observer.on_store_conflict()
        raise
    if observer is not None:
        observer.on_step_result(rec, result, provider)
