"""What a process tells its observer (Prometheus metrics, in ``ops.observability.metrics``).

The dispatch loop, the router service and the worker report domain events to an observer and
never name a metric. Each observer here is a base class whose reports do nothing: a process
with no metrics is given the base class itself, and ``ops.observability.metrics.Metrics`` overrides
them.

Contract for every report: it never raises into the loop and never blocks on I/O; it is
called from the reporting thread, after the fact it reports (a commit is reported only once
its compare-and-set succeeded, so a lost race counts as a conflict, not a step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kernel.context import StepResult
from kernel.record import TrajectoryRecord
from router.admission.drr import ReadyCall
from router.admission.fairness import FairnessFigures
from router.admission.tenants import AdmissionConfig
from router.fleet.tracing import NO_TRACER, Tracer
from router.placement.membership import MemberRecord
from router.wire.streams import GroupLag

#: The provider of a call that goes through no provider gate.
NO_PROVIDER = "none"


def provider_of(route: str | None) -> str:
    """The provider of a route ``provider/model``; ``none`` for no route."""
    return route.split("/", 1)[0] if route else NO_PROVIDER


class CommitObserver:
    """Told of each step a process committed, and of each compare-and-set it lost.

    ``tracer`` makes the spans of what is observed (:mod:`router.fleet.tracing`; none by default);
    a process that traces sets it on its observer at boot.
    """

    tracer: Tracer = NO_TRACER

    def on_step_result(
        self, record: TrajectoryRecord, result: StepResult, provider: str = NO_PROVIDER
    ) -> None:
        """``result`` was committed over ``record``; ``provider`` made its model calls."""

    def on_store_conflict(self) -> None:
        """A compare-and-set lost to another writer (the loser reloads and re-decides)."""


class AdmissionObserver(CommitObserver):
    """Told what the dispatch loop admitted and what the provider gates refused."""

    def on_admission(self, call: ReadyCall, wait_s: float) -> None:
        """``call`` was admitted (committed and sent) after ``wait_s`` seconds READY."""

    def on_gate_refused(self, provider: str, gate: str, count: int = 1) -> None:
        """``count`` nominations a gate of ``provider`` refused for ``gate`` (its reason)."""


class RouterObserver(AdmissionObserver):
    """Also told, at boot and at each tick, what the router's configuration and state are."""

    def on_config(self, config: AdmissionConfig) -> None:
        """The tenants this router admits for."""

    def on_figures(self, figures: FairnessFigures) -> None:
        """The admitter's snapshot (this router admits)."""

    def forget_figures(self) -> None:
        """This router does not admit now (it stands by for the admitter's lease)."""

    def on_membership(self, records: Iterable[MemberRecord]) -> None:
        """The ring's membership as read from Redis."""

    def on_held_approvals(self, held: Mapping[str, int]) -> None:
        """Trajectories held for approval, per tenant."""

    def on_owed_runs(self, owing: Mapping[str, int]) -> None:
        """Ended runs that still owe an operation's settlement, per tenant
        (``router.process.owed``)."""

    def on_feed_lag(self, lag: Mapping[str, GroupLag]) -> None:
        """How far the routers trail each feed stream, by source (``notices``, ``handbacks``)."""

    def on_poison(self, source: str, count: int) -> None:
        """``count`` entries of the feed's ``source`` stream (``notices``, ``handbacks``) did
        not decode and were moved to the dead letters."""
