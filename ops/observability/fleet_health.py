"""The fleet-health half of the metrics: what an operator watches beside fairness.

Recoveries, hand-backs, poison notices (in :mod:`ops.observability.metrics`), chained (follow-on)
turns, each worker's queue depth and oldest message age, the feed's lag, Redis errors and the
placement's affinity. :class:`FleetHealth` is mixed into :class:`ops.observability.metrics.Metrics`;
every label takes a closed list or the worker label, which is ``REINS_METRICS_WORKER_LABEL`` when
set (a name that outlives a rollout: the Deployment's, or an ordinal), the ring member otherwise;
``reins_worker_info`` names the member (the pod) behind it. Why: docs/adr/0151-fleet-health.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kernel.chain import ChainRow, RowKind
from router.wire.feed import FeedSource
from router.wire.streams import GroupLag
from router.wire.turns import HandBackWhy
from store.redis_client import REDIS_ERRORS

#: The states a stranded turn is recovered from (the kernel's recovery rows say which).
RECOVERED_STATES = ("CALLING_MODEL", "WAITING_TOOL")
#: Whether a turn ran where its trajectory's previous turn ran.
AFFINITY = ("hit", "miss")
OTHER = "other"


class _RedisErrors(Collector):
    """``reins_redis_errors_total``: read from the process's count at each scrape."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "reins_redis_errors",
            "Transient Redis errors met (timeouts, refused connections), each failed attempt.",
        )
        family.add_metric([], REDIS_ERRORS.value)
        yield family


class FleetHealth:
    """Registers and feeds the fleet-health metrics (see the module docstring)."""

    worker_label = ""

    def register_health(self, r: CollectorRegistry, worker_label: str = "") -> None:
        """Register every fleet-health metric in ``r``, each series of a closed list from 0."""
        self.worker_label = worker_label
        self.recoveries = Counter(
            "reins_recoveries",
            "Stranded turns recovered from the store, by the state they were stranded in.",
            ["state"],
            registry=r,
        )
        self.handbacks = Counter(
            "reins_handbacks",
            "Turn messages a worker gave back unstarted, by why.",
            ["worker", "why"],
            registry=r,
        )
        self.follow_ons = Counter(
            "reins_follow_on_turns",
            "Turns a worker admitted itself and ran chained after the previous one.",
            ["worker"],
            registry=r,
        )
        self.affinity = Counter(
            "reins_turn_affinity",
            "Turns that had a previous turn, by whether they ran where it ran.",
            ["worker", "placement"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "reins_worker_queue_depth",
            "Turn messages waiting in the worker's queue.",
            ["worker"],
            registry=r,
        )
        self.queue_age = Gauge(
            "reins_worker_queue_oldest_age_seconds",
            "Time since the oldest waiting turn message was admitted (0: none waits).",
            ["worker"],
            registry=r,
        )
        self.feed_lag = Gauge(
            "reins_feed_lag_entries",
            "Entries of a feed stream appended and not yet delivered to any router.",
            ["source"],
            registry=r,
        )
        self.feed_pending = Gauge(
            "reins_feed_pending_entries",
            "Entries of a feed stream delivered to a router and not yet acknowledged.",
            ["source"],
            registry=r,
        )
        self.worker_info = Gauge(
            "reins_worker_info",
            "The ring member (the pod) behind a worker label; 1 while it runs.",
            ["worker", "member"],
            registry=r,
        )
        r.register(_RedisErrors())
        for state in RECOVERED_STATES:
            self.recoveries.labels(state)
        for source in FeedSource:
            self.feed_lag.labels(source.value)
            self.feed_pending.labels(source.value)

    def worker_of(self, member: str) -> str:
        """The worker label of ring member ``member``."""
        return self.worker_label or member

    def on_worker(self, member: str) -> None:
        """This process is worker ``member``: its info series, its per-worker series from 0."""
        worker = self.worker_of(member)
        self.worker_info.labels(worker, member).set(1)
        self.follow_ons.labels(worker)
        for why in HandBackWhy:
            self.handbacks.labels(worker, why.value)
        for placement in AFFINITY:
            self.affinity.labels(worker, placement)
        self.queue_depth.labels(worker)
        self.queue_age.labels(worker)

    def count_recoveries(self, rows: list[ChainRow]) -> None:
        """Count the recovery rows among a committed step's ``rows``."""
        for row in rows:
            if row.kind is RowKind.CONTROL and row.outcome == "recovered":
                state = (row.detail or {}).get("state")
                self.recoveries.labels(state if state in RECOVERED_STATES else OTHER).inc()

    def on_affinity(self, worker: str, hit: bool) -> None:
        """A turn with a previous turn started on ``worker``; ``hit``: it ran that one too."""
        self.affinity.labels(self.worker_of(worker), AFFINITY[0] if hit else AFFINITY[1]).inc()

    def on_follow_on(self, worker: str) -> None:
        """``worker`` ran a turn it admitted itself."""
        self.follow_ons.labels(self.worker_of(worker)).inc()

    def on_hand_back(self, worker: str, why: HandBackWhy) -> None:
        """``worker`` gave a turn message back unstarted."""
        self.handbacks.labels(self.worker_of(worker), why.value).inc()

    def on_queue(self, worker: str, depth: int, oldest_age_s: float) -> None:
        """``worker``'s queue: its depth and its oldest message's age, at a heartbeat."""
        label = self.worker_of(worker)
        self.queue_depth.labels(label).set(depth)
        self.queue_age.labels(label).set(oldest_age_s)

    def on_feed_lag(self, lag: Mapping[str, GroupLag]) -> None:
        """How far the routers trail each feed stream (a stream not there yet: 0)."""
        for source in FeedSource:
            got = lag.get(source.value)
            self.feed_lag.labels(source.value).set(max(got.lag, 0) if got else 0)
            self.feed_pending.labels(source.value).set(got.pending if got else 0)
