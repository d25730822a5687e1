"""A fleet worker process: a Celery worker on its ring member's queue, with membership and drain.

:func:`run_worker` boots the worker (``reins worker --name NAME``) and runs it. Once Celery
consumes ``reins.turns.<name>``, the member registers, heartbeats and listens for cancels.
SIGTERM or ``reins ring drain NAME`` drains it: routers stop placing turns here, and it carries
turns out until every live router has acknowledged, its queue is empty and no turn runs, handing
the rest back unstarted if ``REINS_DRAIN_GRACE_S`` runs out; then it deregisters and exits 0. A
turn sent after the drain was acknowledged is still carried out, and logged as an error
(``sent after the drain was acknowledged``). See docs/adr/0042-worker-drain.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import redis
from celery import signals

from kernel.agent import AgentModule
from kernel.errors import InvalidInput, UnknownMember
from kernel.settings import Settings
from kernel.tools import ToolBackend
from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from router.fleet.agents import AgentCache
from router.fleet.config import ConfigSource, authority_lookup, importable
from router.fleet.health import Beat, HealthServer, live_within_s, serve_probes
from router.fleet.routes import following
from router.placement.membership import Membership, Progress
from router.wire.broker import TURN_TASK, noops_key
from router.wire.custody import Custody
from router.wire.feed import CancelListener, Feed
from router.wire.publishers import member_queue
from router.wire.turns import HandBackWhy, TurnMessage
from store.memory_redis import RedisMemory
from store.redis_client import client_for
from worker.allowed import AllowListedStore
from worker.celery_app import worker_app
from worker.fleet_agents import BackendFactory, ModelOverrides, TurnTools
from worker.follow_on import FollowOn
from worker.leases import LeaseKeeper
from worker.providers.base import InFlightCalls
from worker.providers.embeddings import Embedder
from worker.providers.http import PoolOptions
from worker.routes import RouteModels
from worker.tool_gates import ToolGates, gated_route, lease_ttl_s
from worker.turn import TurnObserver, TurnRunner

log = logging.getLogger("reins.worker")
DRAIN_POLL_S = 0.1  # how often a draining worker re-reads its queue and the acknowledgement


#: A shared tool backend for a fleet: (agent, settings, the worker's Redis client) -> backend.
SharedBackend = Callable[[AgentModule, Settings, redis.Redis], ToolBackend]


@dataclass
class WorkerOptions:
    """What ``reins worker`` is told beyond the settings."""

    name: str
    weight: float = 1.0
    overrides: ModelOverrides = field(default_factory=ModelOverrides)
    backend: SharedBackend | None = None  # None: each agent's own ``make_backend()``


class FleetWorker:
    """The parts of one worker process; see the module docstring for the life cycle."""

    def __init__(
        self,
        settings: Settings,
        options: WorkerOptions,
        *,
        client: redis.Redis | None = None,
        env: Mapping[str, str] | None = None,
        observer: TurnObserver | None = None,
    ) -> None:
        self.settings, self.options = settings, options
        self.name = options.name
        self.client = client if client is not None else client_for(settings)
        self.store = AllowListedStore(
            self.client, prefix=settings.key_prefix, retry_attempts=settings.redis_retry_attempts
        )
        source = self.store.source = ConfigSource(self.client, settings.key_prefix)
        redis_broker = (
            self.client if client is not None or settings.broker_url == settings.redis_url else None
        )
        self.broker = member_queue(settings, self.name, redis_broker)
        self.queue = self.broker.name
        self.membership = Membership.of(self.client, settings)
        self.incarnation = uuid.uuid4().hex  # this process; a restart under the name is another
        self.feed = Feed(self.client, settings.key_prefix)
        self.calls_in_flight = InFlightCalls()
        self.listener = CancelListener(self.feed, self._cancel)
        factory: BackendFactory | None = None
        shared = options.backend
        if shared is not None:
            client_ = self.client

            def factory(agent: AgentModule, ref: str) -> ToolBackend:
                return shared(agent, settings, client_)

        # Renewing needs no gate configuration: each route's ttl is in Redis (router boot).
        gates = RedisGates(self.client, GateConfig(routes={}), prefix=settings.key_prefix)
        self.leases = LeaseKeeper(gates)
        environ = env if env is not None else os.environ
        pool_options = PoolOptions.from_settings(settings)
        routed = following(source.peek)
        tools = TurnTools(
            AgentCache(importable(source), routed, authority_lookup(source)),
            environ,
            options.overrides,
            factory,
            RedisMemory(self.client, prefix=settings.key_prefix),
            pool_options=pool_options,
            embedder=Embedder.from_settings(settings, environ),
            routes=RouteModels(
                routed, environ, pool_options=pool_options, gates=gates, leases=self.leases
            ),
        )
        custody = self.custody = Custody(self.client, settings.key_prefix)
        self._draining = threading.Event()
        self.observed = observer is not None  # the queue's figures cost a read: only if heard
        self.runner = TurnRunner(
            store=self.store,
            tools=tools,
            feed=self.feed,
            worker=self.name,
            calls_in_flight=self.calls_in_flight,
            listener=self.listener,
            custody=custody,
            observer=observer,
            leases=self.leases,
            follow_on=self._follow_on(gates, custody, observer, source),
            max_call_s=settings.max_turn_s,
            look_first=settings.look_up_before_write,
            tool_gates=ToolGates(
                gates,
                self.leases,
                partial(lease_ttl_s, source),
                gated=partial(gated_route, source),
            ),
        )
        self._stop = threading.Event()
        self._handing_back = threading.Event()  # the drain grace ran out: give turns back
        self.acked_at: float | None = None  # when this worker saw its drain acknowledged
        self.drain_figures: Counter[str] = Counter()
        self._beat: threading.Thread | None = None
        self.beat = Beat("the heartbeat")
        self.registered = False
        self.taken = self.finished = 0  # messages this consumer took, and finished
        self.received = 0  # turn messages the consumer received (started or not)
        self.turn_cpu_s = 0.0  # CPU the turns themselves took in their threads (not Celery's)
        self.noops, self.last_noop_at, self._noops_told = 0, 0.0, 0  # the benchmark's no-ops
        self._figures = threading.Lock()

    def _follow_on(
        self,
        gates: RedisGates,
        custody: Custody,
        observer: TurnObserver | None,
        document: ConfigSource,
    ) -> FollowOn | None:
        """Follow-on turns (:mod:`worker.follow_on`) through the shared admitter, configured by
        the fleet's ``document`` as the routers are."""
        return FollowOn.configured(
            self.settings,
            worker=self.name,
            client=self.client,
            store=self.store,
            gates=gates,
            custody=custody,
            feed=self.feed,
            draining=self._draining.is_set,
            observer=observer,
            document=document,
        )

    # --- the task ------------------------------------------------------------------------------

    def handle_turn(self, payload: dict[str, Any], redelivered: bool) -> None:
        """The turn task's body: parse the message and run the turn (never raises)."""
        with self._figures:
            self.taken += 1
        try:
            self._handle(payload, redelivered)
        finally:
            with self._figures:
                self.finished += 1

    def _handle(self, payload: dict[str, Any], redelivered: bool) -> None:
        try:
            msg = TurnMessage.from_payload(payload)
        except Exception as exc:
            log.warning("ignored a malformed turn message on %s: %s", self.name, exc)
            return
        if self._draining.is_set():
            if self._handing_back.is_set():
                self.runner.hand_back(msg, HandBackWhy.DRAINING)
                self._count("handed back")
                return
            if self.acked_at is not None and msg.admitted_at > self.acked_at:
                log.error(
                    "turn of %s was sent to %s after the drain was acknowledged "
                    "(admitted at %.3f, acknowledged at %.3f)",
                    msg.trajectory_id,
                    self.name,
                    msg.admitted_at,
                    self.acked_at,
                )
                self._count("sent after the acknowledgement")
            self._count("carried out while draining")
        started = time.thread_time()
        self.runner.run(msg, redelivered=redelivered)
        spent = time.thread_time() - started
        with self._figures:
            self.turn_cpu_s += spent

    def note_noop(self) -> None:
        """A no-op task ran here (``reins bench fleet`` counts them)."""
        with self._figures:
            self.noops += 1
            self.last_noop_at = time.time()

    def _report_noops(self) -> None:
        """Tell the benchmark how many no-op tasks ran here, and when the last one did."""
        with self._figures:
            noops, at = self.noops, self.last_noop_at
        if noops != self._noops_told:
            self.client.hset(noops_key(self.settings.key_prefix), self.name, f"{noops}:{at:.6f}")
            self._noops_told = noops

    def _count(self, what: str) -> None:
        with self._figures:
            self.drain_figures[what] += 1

    def _cancel(self, call_id: str) -> None:
        if self.calls_in_flight.cancel(call_id):
            log.info("canceled model call %s on %s", call_id, self.name)

    # --- life cycle ----------------------------------------------------------------------------

    def boot(self) -> None:
        """Before consuming: hand what an earlier incarnation of this name had in custody to a
        custodian no member is named after, so the routers' reconciler recovers those turns
        (a container restarted under its old name, within the heartbeat timeout or not)."""
        previous = self.membership.incarnation(self.name) or "unknown"
        moved = self.custody.orphan(self.name, f"{self.name} (incarnation {previous[:12]})")
        if moved:
            log.warning(
                "%s: %d turns of incarnation %s handed to the reconciler",
                self.name,
                moved,
                previous,
            )

    def on_ready(self) -> None:
        """The consumer is consuming: register, start heartbeats and the cancel listener."""
        self.listener.start()
        self.membership.register(self.name, self.options.weight, self.incarnation)
        self.registered = True
        self._beat = threading.Thread(target=self._heartbeat, name="reins-heartbeat", daemon=True)
        self._beat.start()
        log.info("worker %s ready on queue %s", self.name, self.queue)

    def on_shutdown(self) -> None:
        """Celery stopped: stop the threads and deregister."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        for last in (self._flush_delays, self.runner.push_kept):
            try:
                last()
            except Exception as exc:
                log.warning("%s of %s failed at shutdown: %s", last.__name__, self.name, exc)
        self.listener.stop()
        self.broker.close()
        with contextlib.suppress(UnknownMember):
            self.membership.remove(self.name)
        turns = self.runner.turns
        per_turn = self.turn_cpu_s * 1000 / turns if turns else 0.0
        log.info(
            "worker %s deregistered after %d turns (%.2f ms CPU each)", self.name, turns, per_turn
        )
        follow_on = self.runner.follow_on
        if follow_on is not None:
            log.info(
                "worker %s admitted %d turns itself and left %d to the routers",
                self.name,
                follow_on.admitted,
                follow_on.passed,
            )

    def probes(self) -> HealthServer | None:
        """/livez: heartbeats go on and the consumer is not wedged; /readyz: registered and not
        draining (None when ``REINS_HEALTH_PORT`` is 0)."""
        within = live_within_s(self.settings)

        def live() -> str | None:
            return self.beat.stale(within) or self.stalled()

        return serve_probes(self.settings, live=live, ready=self._readiness)

    def _readiness(self) -> str | None:
        if not self.registered:
            return "not registered yet"
        if self._draining.is_set():
            return "draining"
        return None

    def progress(self) -> Progress:
        """What the consumer has done, and how many messages wait for it: in its queue, and
        received by it but not started (a turn message may wait here behind turns that run
        long; the routers' stranded-turn sweep must not take it for lost)."""
        with self._figures:
            taken, finished, waiting = self.taken, self.finished, self.received - self.taken
        try:
            queued = self.queued()
        except Exception:  # the broker is out of reach: no work seen, nothing to call stalled
            queued = 0
        return Progress(taken, finished, queued + max(waiting, 0))

    def note_received(self, name: str) -> None:
        """The consumer received a task message (a turn's is counted until it starts)."""
        if name == TURN_TASK:
            with self._figures:
                self.received += 1

    def stalled(self) -> str | None:
        """Why this worker's consumer looks wedged (its queue has work and it took nothing for
        ``REINS_STALL_TIMEOUT_S``), or None; its own liveness probe fails on it."""
        record = next((r for r in self.membership.records() if r.name == self.name), None)
        if record is None or not record.stalled:
            return None
        return f"{record.progress.queued} messages wait and the consumer took none"

    def _heartbeat(self) -> None:
        """Every interval: the heartbeat, then the chores that ride on it. A chore that fails
        (Redis out of reach) is logged and tried at the next beat; the thread never ends."""
        interval = self.settings.heartbeat_interval_s
        chores: tuple[Callable[[], object], ...] = (
            self._beat_once,
            self._flush_delays,
            self._report_noops,
            self.leases.renew_due,
            self.runner.push_kept,
        )
        if self.observed:
            chores += (self._report_queue,)
        while not self._stop.wait(interval):
            self.beat.mark()
            for chore in chores:
                try:
                    chore()
                except Exception as exc:
                    log.warning("%s of %s failed: %s", chore.__name__, self.name, exc)

    def _beat_once(self) -> None:
        try:
            self.membership.heartbeat(self.name, self.progress())
        except UnknownMember:
            if not self._draining.is_set():
                log.warning("%s was removed from the ring; registering again", self.name)
                self.membership.register(self.name, self.options.weight, self.incarnation)
            return
        if not self._draining.is_set() and self.membership.is_draining(self.name):
            # `reins ring drain NAME`: the same drain as SIGTERM, through its handler.
            log.info("%s was drained by an operator; draining and stopping", self.name)
            os.kill(os.getpid(), signal.SIGTERM)

    def _report_queue(self) -> None:
        """Tell the observer this member's queue depth and its oldest message's age."""
        depth, age = self.broker.figures(time.time())
        self.runner.observer.on_queue(self.name, depth, age)

    def _flush_delays(self) -> None:
        """Report the admission-to-start delays measured since the last beat."""
        self.feed.record_starts(self.runner.take_delays())

    # --- drain ---------------------------------------------------------------------------------

    def install_drain(self) -> None:
        """Put the drain in front of Celery's warm shutdown on SIGTERM (main thread only)."""
        celery_handler = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: Any) -> None:
            if self._draining.is_set():
                return
            self._draining.set()
            threading.Thread(
                target=self._drain_then_stop,
                args=(celery_handler, signum, frame),
                name="reins-drain",
                daemon=True,
            ).start()

        signal.signal(signal.SIGTERM, on_term)

    def _drain_then_stop(self, celery_handler: Any, signum: int, frame: Any) -> None:
        grace = self.settings.drain_grace_s
        log.info("worker %s draining (grace %.1fs)", self.name, grace)
        deadline = time.monotonic() + grace
        try:
            self.membership.drain(self.name)
            while not self.drained():
                if time.monotonic() >= deadline:
                    self._hand_back_the_rest()
                    break
                time.sleep(DRAIN_POLL_S)
        except Exception:
            log.exception("drain of %s failed; shutting down anyway", self.name)
        log.info("drain of %s: %s", self.name, dict(self.drain_figures) or "nothing to do")
        if callable(celery_handler):
            celery_handler(signum, frame)  # Celery's warm shutdown: finish what runs

    def _hand_back_the_rest(self) -> None:
        """The grace ran out: give every message still queued back, unstarted (the consumer
        hands back what it takes from now on, too)."""
        self._handing_back.set()
        log.warning(
            "drain grace of %s ran out with %d turns running and %d queued; handing back "
            "what has not started",
            self.name,
            self.runner.active,
            self.queued(),
        )
        while payloads := self.broker.take_turns(256):
            for payload in payloads:
                try:
                    msg = TurnMessage.from_payload(payload)
                except InvalidInput as exc:
                    log.warning("dropped a malformed queued turn message: %s", exc)
                    continue
                self.runner.hand_back(msg, HandBackWhy.DRAINING)
                self._count("handed back")

    def queued(self) -> int:
        """Messages waiting in this member's queue."""
        return self.broker.depth()

    def drained(self) -> bool:
        """Every live router stopped placing turns here, none is queued and none runs."""
        status = self.membership.drain_status(self.name)
        if status.pending:
            return False
        if self.acked_at is None:
            self.acked_at = time.time()
            log.info("drain of %s acknowledged by %s", self.name, status.live_replicas or "none")
        return self.queued() == 0 and self.runner.active == 0


def run_worker(
    settings: Settings, options: WorkerOptions, observer: TurnObserver | None = None
) -> int:
    """Boot a worker and run it until it is told to stop; returns the exit code. ``observer``
    (metrics) is told of every turn the worker runs."""
    worker = FleetWorker(settings, options, observer=observer)
    worker.boot()
    probes = worker.probes()
    app = worker_app(settings, worker.handle_turn, worker.broker.consumed(), worker.note_noop)

    def ready(**_: Any) -> None:
        worker.on_ready()
        if threading.current_thread() is threading.main_thread():
            worker.install_drain()
        else:  # pragma: no cover - Celery runs the consumer in the main thread
            log.warning("SIGTERM drain not installed: worker_ready ran off the main thread")

    def shutdown(**_: Any) -> None:
        worker.on_shutdown()

    def received(request: Any = None, **_: Any) -> None:
        worker.note_received(getattr(request, "name", ""))

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutdown.connect(shutdown, weak=False)
    signals.task_received.connect(received, weak=False)
    celery_worker: Any = app.Worker(
        hostname=f"{options.name}@{socket.gethostname()}",
        queues=[worker.queue],
        pool_cls="threads",
        concurrency=settings.worker_concurrency,
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        loglevel="WARNING",
        quiet=True,
    )
    celery_worker.start()
    if probes is not None:
        probes.stop()
    code: int = celery_worker.exitcode or 0
    return code


def configure_logging(name: str, level: str) -> None:
    """One line per record on stderr, naming the process; Celery's own chatter at WARNING."""
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("reins").setLevel(level.upper())
