"""A fleet worker process: a Celery worker on its ring member's queue, with membership and drain.

:func:`run_worker` is the boot step and the main loop (``reins worker --name NAME``):

1. **Boot**: settings, one Redis client for the store, the membership and the feed (the broker
   is Celery's own connection to ``REINS_BROKER_URL``), the turn runner, the Celery app with
   the turn task, and a thread pool of ``REINS_WORKER_CONCURRENCY`` threads.
2. **Ready** (the consumer is consuming ``reins.turns.<name>``): register in the ring's
   membership, heartbeat every ``REINS_HEARTBEAT_INTERVAL_S`` (each beat also reports the
   admission-to-start delays measured since the last), and listen on the cancel channel so a
   ``CancelCall`` from any router stops a stream this worker holds at once.
3. **SIGTERM** (a basic drain; issue 12 deepens it): flag the member draining so routers stop
   placing turns here, keep consuming until every live router acknowledged the drain and this
   member's queue is empty (at most ``REINS_DRAIN_GRACE_S``), then Celery's warm shutdown
   finishes the turns in flight; finally deregister. Turns still queued when the grace runs
   out stay in the queue for the reconciler (issue 12); nothing is lost from the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from kernel.errors import UnknownMember
from kernel.settings import Settings
from router.feed import CancelListener, Feed, TurnMessage
from router.membership import Membership
from router.reconcile import Holdings
from store.redis_store import RedisStore, client_from_url
from worker.agents import AgentModule
from worker.backend import ToolBackend
from worker.celery_app import broker_keyprefix, make_app, queue_for
from worker.fleet_agents import AgentCache, BackendFactory, ModelOverrides, TurnTools
from worker.providers.base import InflightCalls
from worker.turn import TurnRunner

log = logging.getLogger("reins.worker")


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
    ) -> None:
        self.settings, self.options = settings, options
        self.name = options.name
        self.queue = queue_for(self.name)
        self.client = client if client is not None else client_from_url(settings.redis_url)
        self.store = RedisStore(
            self.client, prefix=settings.key_prefix, retry_attempts=settings.redis_retry_attempts
        )
        self.membership = Membership(
            self.client, settings.key_prefix, heartbeat_timeout_s=settings.heartbeat_timeout_s
        )
        self.feed = Feed(self.client, settings.key_prefix)
        self.inflight = InflightCalls()
        self.listener = CancelListener(self.feed, self._cancel)
        factory: BackendFactory | None = None
        shared = options.backend
        if shared is not None:
            client_ = self.client

            def factory(agent: AgentModule, ref: str) -> ToolBackend:
                return shared(agent, settings, client_)

        tools = TurnTools(
            AgentCache(), env if env is not None else os.environ, options.overrides, factory
        )
        self.runner = TurnRunner(
            store=self.store,
            tools=tools,
            feed=self.feed,
            worker=self.name,
            inflight=self.inflight,
            listener=self.listener,
            holdings=Holdings(self.client, settings.key_prefix),
        )
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._beat: threading.Thread | None = None
        self.turn_cpu_s = 0.0  # CPU the turns themselves took in their threads (not Celery's)
        self._figures = threading.Lock()

    # --- the task ------------------------------------------------------------------------------

    def handle_turn(self, payload: dict[str, Any], redelivered: bool) -> None:
        """The turn task's body: parse the message and run the turn (never raises)."""
        try:
            msg = TurnMessage.from_payload(payload)
        except Exception as exc:
            log.warning("ignored a malformed turn message on %s: %s", self.name, exc)
            return
        started = time.thread_time()
        self.runner.run(msg, redelivered=redelivered)
        spent = time.thread_time() - started
        with self._figures:
            self.turn_cpu_s += spent

    def _cancel(self, call_id: str) -> None:
        if self.inflight.cancel(call_id):
            log.info("canceled model call %s on %s", call_id, self.name)

    # --- life cycle ----------------------------------------------------------------------------

    def on_ready(self) -> None:
        """The consumer is consuming: register, start heartbeats and the cancel listener."""
        self.listener.start()
        self.membership.register(self.name, self.options.weight)
        self._beat = threading.Thread(target=self._heartbeat, name="reins-heartbeat", daemon=True)
        self._beat.start()
        log.info("worker %s ready on queue %s", self.name, self.queue)

    def on_shutdown(self) -> None:
        """Celery stopped: stop the threads and deregister."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        self._flush_delays()
        self.listener.stop()
        with contextlib.suppress(UnknownMember):
            self.membership.remove(self.name)
        turns = self.runner.turns
        per_turn = self.turn_cpu_s * 1000 / turns if turns else 0.0
        log.info(
            "worker %s deregistered after %d turns (%.2f ms CPU each)", self.name, turns, per_turn
        )

    def _heartbeat(self) -> None:
        interval = self.settings.heartbeat_interval_s
        while not self._stop.wait(interval):
            try:
                self.membership.heartbeat(self.name)
            except UnknownMember:
                if not self._draining.is_set():
                    log.warning("%s was removed from the ring; registering again", self.name)
                    self.membership.register(self.name, self.options.weight)
            except Exception:
                log.exception("heartbeat of %s failed", self.name)
            self._flush_delays()

    def _flush_delays(self) -> None:
        try:
            self.feed.record_starts(self.runner.take_delays())
        except Exception:
            log.exception("could not report admission-to-start delays")

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
        log.info("worker %s draining (grace %.1fs)", self.name, self.settings.drain_grace_s)
        deadline = time.monotonic() + self.settings.drain_grace_s
        try:
            self.membership.drain(self.name)
            while time.monotonic() < deadline and not self.drained():
                time.sleep(0.1)
        except Exception:
            log.exception("drain of %s failed; shutting down anyway", self.name)
        if callable(celery_handler):
            celery_handler(signum, frame)  # Celery's warm shutdown: finish what runs

    def drained(self) -> bool:
        """Every live router stopped placing turns here and none is left in the queue."""
        status = self.membership.drain_status(self.name)
        if status.pending:
            return False
        waiting: Any = self.client.llen(broker_keyprefix(self.settings) + self.queue)
        return int(waiting) == 0 and self.runner.active == 0


def run_worker(settings: Settings, options: WorkerOptions) -> int:
    """Boot a worker and run it until it is told to stop; returns the exit code."""
    from celery import signals

    worker = FleetWorker(settings, options)
    app = make_app(settings, on_turn=worker.handle_turn)

    def ready(**_: Any) -> None:
        worker.on_ready()
        if threading.current_thread() is threading.main_thread():
            worker.install_drain()
        else:  # pragma: no cover - Celery runs the consumer in the main thread
            log.warning("SIGTERM drain not installed: worker_ready ran off the main thread")

    def shutdown(**_: Any) -> None:
        worker.on_shutdown()

    signals.worker_ready.connect(ready, weak=False)
    signals.worker_shutdown.connect(shutdown, weak=False)
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
    code: int = celery_worker.exitcode or 0
    return code


def configure_logging(name: str, level: str) -> None:
    """One line per record on stderr, naming the process; Celery's own chatter at WARNING."""
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("reins").setLevel(level.upper())
