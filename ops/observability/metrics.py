"""Prometheus metrics of the fleet: one object around its own registry, fed by domain events.

Nothing registers at import: a process's boot step (:func:`served`) builds :class:`Metrics` and
hands it to the router and the worker as their observer (it overrides
:class:`router.fleet.observe.RouterObserver` and :class:`worker.turn.TurnObserver`), so the loops
never name a metric. Labels are tenants and closed lists, never trajectory ids; a report never
raises. Why, and how the gauges aggregate across replicas: ``docs/adr/0080-metrics-middleware.md``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from decimal import Decimal
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from kernel.chain import ChainRow, RowKind
from kernel.context import StepResult
from kernel.errors import ConcurrentModification, ConfigError
from kernel.events import ReplyStatus
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import StopReason
from ops.observability.fleet_health import OTHER, FleetHealth
from router.admission.drr import ReadyCall
from router.admission.fairness import FairnessFigures
from router.admission.tenants import DEFAULT_WAIT_BUCKETS_S, AdmissionConfig
from router.fleet.observe import NO_PROVIDER, RouterObserver, provider_of
from router.placement.membership import MemberRecord
from router.wire.feed import FeedSource
from worker.turn import TurnObserver

log = logging.getLogger(__name__)

#: Turn duration bounds in seconds: a turn is a model call or a tool dispatch and its fold.
TURN_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: Tool outcomes as the kernel's chain rows record them; anything else is ``other``.
TOOL_OUTCOMES = frozenset({"ok", "error", "unknown", "absent"})
#: Ring membership states: live and taking work, live and draining, heartbeat lapsed.
RING_STATES = ("active", "draining", "lapsed")
#: The stops that are a budget limit binding: what the cut-off rate counts.
BUDGET_LIMITS = (
    StopReason.MAX_STEPS,
    StopReason.MAX_TOOL_CALLS,
    StopReason.MAX_TOKENS,
    StopReason.MAX_COST,
    StopReason.DEADLINE,
    StopReason.WALL_CLOCK,
)

_REPLY_STATUSES = frozenset(s.value for s in ReplyStatus)
_STOP_REASONS = {s.value: s for s in StopReason}
_FEED_SOURCES = frozenset(s.value for s in FeedSource)

Commit = Callable[[TrajectoryRecord, TrajectoryRecord, list[ChainRow]], None]
"""The worker's store hook: (previous record, new record, chain rows), raising on conflict."""


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it and frees the port."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """Where Prometheus scrapes."""
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving; returns once the serving thread has ended."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class Metrics(FleetHealth, RouterObserver, TurnObserver):
    """Every metric of a reins process, registered in this object's own registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        wait_buckets_s: Sequence[float] = DEFAULT_WAIT_BUCKETS_S,
        turn_buckets_s: Sequence[float] = TURN_BUCKETS_S,
        process_metrics: bool = True,
        worker_label: str = "",
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.register_health(r, worker_label)
        if process_metrics:  # process_*, python_info and python_gc_* of this process
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        # --- admission (router) -------------------------------------------------------------
        self.admissions = Counter(
            "reins_admissions", "Model calls admitted.", ["tenant", "provider"], registry=r
        )
        self.admitted_charge = Counter(
            "reins_admitted_charge_tokens",
            "Scheduling charge admitted: full input tokens plus output allowance.",
            ["tenant"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "reins_admission_wait_seconds",
            "Time a READY call waited in its tenant's queue before admission.",
            ["tenant"],
            buckets=tuple(wait_buckets_s),
            registry=r,
        )
        self.gate_refusals = Counter(
            "reins_gate_refusals",
            "Nominated calls a provider quota gate refused (the call stays READY).",
            ["provider", "gate"],
            registry=r,
        )
        self.ready_depth = Gauge(
            "reins_ready_queue_depth", "READY calls queued per tenant.", ["tenant"], registry=r
        )
        self.credit = Gauge(
            "reins_drr_credit_tokens",
            "Deficit round-robin credit a tenant carries.",
            ["tenant"],
            registry=r,
        )
        self.weight = Gauge(
            "reins_tenant_weight", "A tenant's configured admission weight.", ["tenant"], registry=r
        )
        self.jain = Gauge(
            "reins_fairness_jain_index",
            "Jain's index over weight-normalised charge in the admitter's window (1 = fair).",
            registry=r,
        )
        # --- turns (worker) -----------------------------------------------------------------
        self.turn_duration = Histogram(
            "reins_turn_duration_seconds",
            "Wall time of one turn on a worker.",
            ["worker"],
            buckets=tuple(turn_buckets_s),
            registry=r,
        )
        self.model_calls = Counter(
            "reins_model_calls", "Model replies by status.", ["provider", "status"], registry=r
        )
        self.tool_calls = Counter(
            "reins_tool_calls", "Tool results by outcome.", ["tool", "outcome"], registry=r
        )
        self.memory_recalls = Counter(
            "reins_memory_recalls",
            "recall_facts calls, by whether they found anything (hit or miss).",
            ["tenant", "outcome"],
            registry=r,
        )
        self.embedding_fallbacks = Counter(
            "reins_memory_embedding_fallbacks",
            "recall_facts calls ranked by the text index alone because the embedder "
            "(REINS_EMBEDDINGS_URL) failed or timed out.",
            ["tenant"],
            registry=r,
        )
        self.compactions = Counter(
            "reins_compactions",
            "Scratchpad compactions: model calls that folded old steps into the summary.",
            ["tenant"],
            registry=r,
        )
        self.stops = Counter(
            "reins_trajectory_stops",
            "Trajectories ended, by stop reason.",
            ["tenant", "stop_reason"],
            registry=r,
        )
        self.cutoffs = Counter(
            "reins_budget_cutoffs",
            "Trajectories a budget limit ended, by limit: the cut-off rate is this over "
            "reins_trajectory_stops (seed 000, 'Choosing limits'; reins limits report).",
            ["tenant", "limit"],
            registry=r,
        )
        self.spend = Counter(
            "reins_spend_dollars", "Settled spend in dollars.", ["tenant"], registry=r
        )
        self.held_approvals = Gauge(
            "reins_approvals_held",
            "Trajectories waiting in AWAITING_APPROVAL.",
            ["tenant"],
            registry=r,
        )
        self.owed_runs = Gauge(
            "reins_owed_runs",
            "Ended runs with an operation still unsettled, waiting for the reconciler.",
            ["tenant"],
            registry=r,
        )
        self.store_conflicts = Counter(
            "reins_store_conflicts",
            "Compare-and-set commits that lost to another writer.",
            registry=r,
        )
        self.ring_members = Gauge(
            "reins_ring_members", "Workers in the membership by state.", ["state"], registry=r
        )
        self.poison = Counter(
            "reins_poison_notices",
            "Feed entries that did not decode, moved to the dead letters (reins doctor).",
            ["source"],
            registry=r,
        )
        self._tenants: set[str] = set()
        self.jain.set(math.nan)
        for state in RING_STATES:
            self.ring_members.labels(state).set(0)
        for source in FeedSource:
            self.poison.labels(source.value)

    # --- configuration ------------------------------------------------------------------------

    def on_config(self, config: AdmissionConfig) -> None:
        """Declare the configured tenants: every per-tenant series exists from 0, so rates
        are right from the first increment; tenants no longer configured leave the gauges."""
        names = {t.name for t in config.tenants}
        for gone in self._tenants - names:
            for gauge in (
                self.weight,
                self.ready_depth,
                self.credit,
                self.held_approvals,
                self.owed_runs,
            ):
                _remove(gauge, gone)
        self._tenants = names
        for t in config.tenants:
            self.weight.labels(t.name).set(t.weight)
            self.admitted_charge.labels(t.name)
            self.admission_wait.labels(t.name)
            self.spend.labels(t.name)
            self.held_approvals.labels(t.name)
            self.owed_runs.labels(t.name)
            for reason in StopReason:
                self.stops.labels(t.name, reason.value)
            for limit in BUDGET_LIMITS:
                self.cutoffs.labels(t.name, limit.value)

    # --- admission ----------------------------------------------------------------------------

    def on_admitted(self, tenant: str, provider: str, charge_tokens: int, wait_s: float) -> None:
        """One model call admitted after waiting ``wait_s`` seconds READY."""
        self.admissions.labels(tenant, provider or NO_PROVIDER).inc()
        self.admitted_charge.labels(tenant).inc(max(charge_tokens, 0))
        self.admission_wait.labels(tenant).observe(max(wait_s, 0.0))

    def on_admission(self, call: ReadyCall, wait_s: float) -> None:
        """:meth:`on_admitted` for an admitter's call (what ``Admitter.confirm`` returned)."""
        self.on_admitted(call.tenant, provider_of(call.route), call.charge, wait_s)

    def on_gate_refused(self, provider: str, gate: str, count: int = 1) -> None:
        """``count`` nominations a provider gate refused; ``gate`` is the gate reading's reason
        (``rpm``, ``tpm``, ``concurrency``, ``paused``, ``remaining_tokens``, ...)."""
        if count > 0:
            self.gate_refusals.labels(provider or NO_PROVIDER, gate or OTHER).inc(count)

    def on_figures(self, figures: FairnessFigures) -> None:
        """The admitter's snapshot: READY depth and credit per tenant, Jain's index."""
        for t in figures.tenants:
            self.ready_depth.labels(t.tenant).set(t.queue_depth)
            self.credit.labels(t.tenant).set(t.credit)
        self.jain.set(math.nan if figures.jain_index is None else figures.jain_index)

    def forget_figures(self) -> None:
        """This process no longer owns the admitter: drop its gauges so they do not go stale."""
        self.ready_depth.clear()
        self.credit.clear()
        self.jain.set(math.nan)

    # --- turns --------------------------------------------------------------------------------

    def on_step_result(
        self, record: TrajectoryRecord, result: StepResult, provider: str = NO_PROVIDER
    ) -> None:
        """A committed step: ``record`` is the one the step was applied to. Call it only after
        the commit succeeded, so a lost compare-and-set counts nothing (its winner counts)."""
        if result.record is not record:
            self.on_commit(record, result.record, result.rows, provider)

    def on_commit(
        self,
        before: TrajectoryRecord,
        after: TrajectoryRecord,
        rows: Iterable[ChainRow],
        provider: str = NO_PROVIDER,
    ) -> None:
        """Count what a committed step's chain rows record, and the spend it settled."""
        tenant = after.tenant
        rows = list(rows)
        self.count_recoveries(rows)
        for row in rows:
            if row.kind is RowKind.MODEL:
                status = row.outcome if row.outcome in _REPLY_STATUSES else OTHER
                self.model_calls.labels(provider or NO_PROVIDER, status).inc()
                if (row.detail or {}).get("purpose") == "compaction":
                    self.compactions.labels(tenant).inc()
            elif row.kind is RowKind.TOOL and row.outcome not in ("progress", "waiting"):
                outcome = row.outcome if row.outcome in TOOL_OUTCOMES else OTHER
                self.tool_calls.labels(row.tool or OTHER, outcome).inc()
            elif row.kind is RowKind.STOP:
                reason = _STOP_REASONS.get(row.outcome or "")
                if reason is None:
                    log.warning("stop row with unknown reason %r not counted", row.outcome)
                    continue
                self.stops.labels(tenant, reason.value).inc()
                if reason in BUDGET_LIMITS:
                    self.cutoffs.labels(tenant, reason.value).inc()
        spent: Decimal = after.ledger.dollars.actual - before.ledger.dollars.actual
        if spent > 0:
            self.spend.labels(tenant).inc(float(spent))

    def metered_commit(self, inner: Commit, provider: str = NO_PROVIDER) -> Commit:
        """Wrap a worker's store hook: count a lost compare-and-set, count a committed step."""

        def commit(before: TrajectoryRecord, after: TrajectoryRecord, rows: list[ChainRow]) -> None:
            try:
                inner(before, after, rows)
            except ConcurrentModification:
                self.on_store_conflict()
                raise
            self.on_commit(before, after, rows, provider)

        return commit

    def on_worker(self, member: str) -> None:
        """As the fleet-health series, the turn-duration histogram exists from 0: a rate over a
        burst of turns that all ended between two scrapes would otherwise show nothing."""
        super().on_worker(member)
        self.turn_duration.labels(self.worker_of(member))

    def on_turn(self, worker: str, seconds: float) -> None:
        """One turn took ``seconds`` of wall time on ``worker``."""
        self.turn_duration.labels(self.worker_of(worker)).observe(max(seconds, 0.0))

    def on_recall(self, tenant: str, hit: bool) -> None:
        """A ``recall_facts`` call found something or nothing."""
        self.memory_recalls.labels(tenant, "hit" if hit else "miss").inc()

    def on_embedding_fallback(self, tenant: str) -> None:
        """A ``recall_facts`` call fell back to the text index (the embedder failed)."""
        self.embedding_fallbacks.labels(tenant).inc()

    @contextmanager
    def turn_timer(self, worker: str) -> Iterator[None]:
        """Time the block as one turn of ``worker`` (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.on_turn(worker, time.perf_counter() - start)

    # --- fleet state --------------------------------------------------------------------------

    def on_store_conflict(self) -> None:
        """A compare-and-set lost to another writer (the loser reloads and re-decides)."""
        self.store_conflicts.inc()

    def on_membership(self, records: Iterable[MemberRecord]) -> None:
        """The membership as read from Redis: members per state."""
        counts = dict.fromkeys(RING_STATES, 0)
        for m in records:
            counts["lapsed" if not m.live else "draining" if m.draining else "active"] += 1
        for state, n in counts.items():
            self.ring_members.labels(state).set(n)

    def on_held_approvals(self, held: Mapping[str, int]) -> None:
        """Trajectories held for approval per tenant, as counted from the store."""
        for tenant, n in held.items():
            self.held_approvals.labels(tenant).set(n)

    def on_owed_runs(self, owing: Mapping[str, int]) -> None:
        """Ended runs that still owe, per tenant, as the reconciler last listed them."""
        for tenant, n in owing.items():
            self.owed_runs.labels(tenant).set(n)

    def on_poison(self, source: str, count: int) -> None:
        """``count`` entries of the feed's ``source`` stream went to the dead letters; a source
        outside the closed list is logged, not counted."""
        if source not in _FEED_SOURCES:
            log.warning("poison of unknown source %r not counted", source)
        elif count > 0:
            self.poison.labels(source).inc(count)

    # --- exposition ---------------------------------------------------------------------------

    def render(self) -> bytes:
        """The exposition text Prometheus scrapes."""
        return generate_latest(self.registry)

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
        """Serve ``/metrics`` on a daemon thread; port 0 picks a free port (see ``.port``)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return MetricsServer(host, server.server_port, server, thread)


def _remove(gauge: Gauge, tenant: str) -> None:
    with suppress(KeyError):
        gauge.remove(tenant)


@contextmanager
def served(settings: Settings) -> Iterator[Metrics | None]:
    """A process's metrics, served on ``REINS_METRICS_HOST``:``REINS_METRICS_PORT`` for the
    duration of the block; ``None`` (nothing built, nothing served) when the port is 0.

    A port that cannot be bound fails the boot, naming the variable.
    """
    if settings.metrics_port == 0:
        yield None
        return
    metrics = Metrics(worker_label=settings.metrics_worker_label)
    host, port = settings.metrics_host, settings.metrics_port
    try:
        server = metrics.serve(host, port)
    except OSError as exc:
        raise ConfigError(
            f"REINS_METRICS_PORT: cannot serve /metrics on {host}:{port}: {exc}"
        ) from None
    log.info("serving metrics at %s", server.url)
    try:
        yield metrics
    finally:
        server.close()
