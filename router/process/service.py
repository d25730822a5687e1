"""A router process: the ring, the ready feed and the dispatch loop (``reins router``).

:class:`RouterService` boots its parts (:mod:`router.process.boot`), then until SIGTERM alternates a
*tick* every ``REINS_HEARTBEAT_INTERVAL_S / 2`` (ring refresh, hand-backs, recovery, ``Tick`` for
waiting trajectories, lapsed claims or the local admitter's lease, figures:
:mod:`router.process.chores`)
with *cycles* (take notices, settle and requeue, admit what fits). Any number of routers run
side by side; none can admit a call twice. On SIGTERM it stops the loop, gives up the lease,
retires its ring report and exits 0; it holds no turn. Design: ``docs/adr/0009-router-process.md``.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from functools import partial

import redis
from redis.exceptions import RedisError

from kernel.errors import ReinsError
from kernel.settings import Settings
from kernel.states import LifecycleState
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.fleet import config as fleet_config
from router.fleet.config import ConfigSource
from router.fleet.health import Beat, HealthServer, live_within_s, serve_probes
from router.fleet.live import Applied, LiveConfig
from router.fleet.observe import RouterObserver
from router.fleet.routes import fixed
from router.process.boot import AdmitterKind, RouterOptions, RouterParts, load_gate_config
from router.process.chores import (
    HELD_APPROVALS_EVERY_S,
    AdmitterLeadership,
    FleetReport,
    HandBackRelay,
    rebuild_queues,
    reconcile_claims,
)
from router.process.dispatch import Sender
from router.process.heap import return_large_blocks
from router.process.in_flight_sweep import InFlightSweep
from router.process.memory_sweep import MemorySweep, memory_keep_ms
from router.process.owed import OwedRuns
from router.process.reconcile import Reconciler
from router.process.retention import RetentionSweep, retention_s
from router.process.stranded import StrandedTurns
from router.process.submit import RouterApi
from router.process.sweeps import IndexCursor, ReadySweep
from router.process.ticker import Ticker
from store.memory_redis import RedisMemory

__all__ = [
    "FLUSH_ADMISSIONS",
    "HELD_APPROVALS_EVERY_S",
    "SEND_BURST",
    "TICK_EVERY_S",
    "AdmitterKind",
    "RouterOptions",
    "RouterService",
    "load_gate_config",
]

log = logging.getLogger("reins.router")
SEND_BURST = 16  # admissions whose turn messages go out in one pipelined batch
FLUSH_ADMISSIONS = 512  # admission figures written at once between ticks
TICK_EVERY_S = 5.0  # how often waiting trajectories are told the time (router.process.ticker)
FAILED_STEP_PAUSE_S = 0.5  # after a failed tick or cycle: Redis may be restarting


class RouterService:
    """One router process: boots its parts, runs the loop, does the tick's chores."""

    def __init__(
        self,
        settings: Settings,
        options: RouterOptions,
        *,
        client: redis.Redis | None = None,
        sender: Sender | None = None,
        observer: RouterObserver | None = None,
    ) -> None:
        self.settings, self.options, self.name = settings, options, options.name
        self.observer = observer or RouterObserver()
        self.observing = observer is not None  # the tick's figures cost reads: only if heard
        parts = RouterParts.wire(
            settings, options, client=client, sender=sender, observer=self.observer
        )
        self.client, self.store, self.feed = parts.client, parts.store, parts.feed
        self.membership, self.replica = parts.membership, parts.replica
        self.config, self.gate_config = parts.config, parts.gate_config
        self.agents, self.custody, self.outbox = parts.agents, parts.custody, parts.outbox
        self.admission = parts.admission
        self.sender = self.outbox.turn
        self.shared = self.admission.shared
        self.admitting = self.shared
        self.lease = AdmitterLeadership(
            self.client, self.feed.leadership_key, self.name, settings.admitter_leadership_s
        )
        self._stop = threading.Event()
        self.beat = Beat("the router loop")
        self.ticked = Beat("a successful tick")
        self.dispatcher = self.admission.dispatcher(self.store)
        source = ConfigSource(self.client, settings.key_prefix, refresh_s=0)
        self.live = LiveConfig(
            source,
            Applied(self.admission.version, self.config, self.gate_config),
            self._reconfigure,
            gates_override=load_gate_config(options.gates_file) if options.gates_file else None,
        )
        self.relay = HandBackRelay(self.feed, self.replica, self.outbox, options.batch)
        self.in_flight = InFlightSweep(
            self.shared_admitter, self.store, every_s=settings.heartbeat_timeout_s
        )
        self.memory = RedisMemory(
            self.client, prefix=settings.key_prefix, retry_attempts=settings.redis_retry_attempts
        )
        documented = ConfigSource(self.client, settings.key_prefix, refresh_s=MemorySweep.every_s)
        self.memory_sweep = MemorySweep(
            self.memory,
            tenants=lambda: self.swept,
            keep_ms=partial(memory_keep_ms, documented, settings.memory_retention_days),
            clock=time.time,
        )
        self.swept: tuple[str, ...] = ()
        self._sweeps(tuple(t.name for t in self.config.tenants))

    def _sweeps(self, tenants: tuple[str, ...]) -> None:
        """The parts that walk every tenant's trajectories (sweeps, ticks, owed runs, the
        fleet report), over ``tenants``: built at boot, and again when a configuration adds
        a tenant (a retired one stays: what it still runs is swept to the end)."""
        settings = self.settings
        self.swept = tenants
        self.report = FleetReport(self.membership, tenants)
        api = self.api()
        self.stranded = StrandedTurns.over(
            api,
            tenants,
            custody=self.custody,
            after_s=settings.heartbeat_timeout_s,
            slow_after_s=2 * settings.visibility_timeout_s,
            clock=time.monotonic,
            held_after_s=2 * settings.max_turn_s,
            queued=self._queued_at,
        )
        self.ready_sweep = ReadySweep(
            api,
            IndexCursor(self.store, tenants, (LifecycleState.READY,)),
            queued=lambda tid: self.dispatcher.admitter.is_queued(tid),
            grace_s=settings.heartbeat_timeout_s,
            clock=time.monotonic,
        )
        self.ticker = Ticker(api, tenants, TICK_EVERY_S, clock=time.time)
        self.retention = RetentionSweep(
            self.store,
            tenants,
            keep_s=lambda t: retention_s(self.config, t, settings.retention_days),
            clock=time.time,
        )
        self.owed = OwedRuns(
            api,
            tenants,
            after_s=settings.owed_after_s or settings.max_turn_s,
            clock=time.monotonic,
            observer=self.observer,
        )
        self.reconciler = Reconciler(
            api,
            self.membership,
            self.custody,
            ring=lambda: self.replica.ring,
            by=self.name,
            backstop=self.stranded,
            owed=self.owed,
        )

    def shared_admitter(self) -> RedisAdmitter:
        """The admitter every router shares; only a router that runs on it asks."""
        admitter = self.dispatcher.admitter
        assert isinstance(admitter, RedisAdmitter), "this router admits by a local admitter"
        return admitter

    def _queued_at(self, member: str) -> int | None:
        """The queue depth ``member`` reported with its last heartbeat (None: no such member)."""
        record = next((r for r in self.membership.records() if r.name == member), None)
        return None if record is None else record.progress.queued

    def api(self) -> RouterApi:
        """Submission, control and approvals through this router."""
        return RouterApi(
            store=self.store,
            feed=self.feed,
            config=self.config,
            agents=self.agents,
            gate_config=self.gate_config,
            admitter=self.shared_admitter() if self.shared else None,
            sender=self.outbox.now,
            ring=lambda: self.replica.ring,
            observer=self.observer,
            memory=self.memory,
        )

    # --- the tick ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Ring refresh and publication; hand-backs; notices other routers left pending;
        stranded turns; the lease or the claims' reconciler; the admission figures gathered
        since the last tick."""
        self.dispatcher.flush()
        self.live.tick()
        self.replica.refresh()
        self.feed.drain_legacy(self.options.batch)
        self.send_on_handbacks()
        if self.admitting:
            self.reclaim_notices()
        else:
            self.feed.flush()  # standing by: acknowledge what was done before
        self.reconciler.tick()  # lapsed members' turns, then the stranded-turn backstop
        if self.admitting:  # only an admitter knows what its queues hold
            self.ready_sweep.sweep()
        self.ticker.tick()  # time for waiting trajectories (every TICK_EVERY_S)
        self.retention.sweep()  # finished trajectories past their retention, a page
        self.memory_sweep.sweep()  # memory past its expiry or retention, a bounded page
        if self.shared:
            reconcile_claims(self.shared_admitter(), self.store)
            self.in_flight.sweep()  # turns in flight whose trajectory acts no more (ADR 0123)
        else:
            self._hold_leadership()
        if self.observing:
            self.observe(self.observer)

    def _reconfigure(self, new: Applied) -> None:
        """Admit by ``new`` from now on (:mod:`router.fleet.live`)."""
        admission = self.admission
        admission.config, admission.gate_config, admission.version = (
            new.admission,
            new.gates,
            new.version,
        )
        self.config, self.gate_config = new.admission, new.gates
        self.agents.allowed = partial(fleet_config.listed_anywhere, new.admission)
        self.agents.routing = fixed(new.routes)  # routed models priced by the new version
        self.observer.on_config(new.admission)
        added = tuple(t.name for t in new.admission.tenants if t.name not in self.swept)
        if added:
            self._sweeps(self.swept + added)
        d = self.dispatcher
        if isinstance(d.admitter, RedisAdmitter):
            if isinstance(d.gates, RedisGates) and new.gates is not None:
                d.gates.config = new.gates
                d.gates.configure()
            d.gate_config = new.gates
            d.admitter.reconfigure(new.admission, new.version)
        elif self.admitting:  # a local admitter: rebuilt over the new version, refilled
            d.flush()
            self.dispatcher = admission.dispatcher(self.store)
            tenants = (t.name for t in new.admission.tenants)
            rebuild_queues(self.store, tenants, self.agents, self.dispatcher)

    def observe(self, observer: RouterObserver) -> None:
        """Tell ``observer`` the membership and, while this router admits, the admitter's
        figures; every ``HELD_APPROVALS_EVERY_S``, the approvals held per tenant."""
        figures = self.dispatcher.admitter.figures if self.admitting else None
        self.report.tell(observer, figures, self.store)
        observer.on_feed_lag(self.feed.lag())

    def send_on_handbacks(self) -> int:
        """Send the turns members gave back unstarted on to another member, under the same
        call ids and gate lease; returns how many went. One that no member on the ring may take
        now waits for the next tick (with its refusals forgotten: the fleet may have changed)."""
        return self.relay.send_on()

    def reclaim_notices(self) -> int:
        """Take over the notices left pending longer than ``REINS_HEARTBEAT_TIMEOUT_S`` (their
        router died, or failed to act on them) and act on them; returns how many."""
        taken = self.feed.reclaim(self.options.batch)
        if taken:
            self.dispatcher.intake(taken.items)
        self.feed.done(taken)
        return len(taken)

    def _hold_leadership(self) -> None:
        """Renew the local admitter's lease, or stand by; take it over when it is free."""
        if self.admitting:
            if not self.lease.renew():
                log.warning("router %s lost the admitter lease; standing by", self.name)
                self.admitting = False
                self.dispatcher = self.admission.dispatcher(self.store)
            return
        if self.lease.take():
            self.dispatcher = self.admission.dispatcher(self.store)
            tenants = (t.name for t in self.config.tenants)
            queued = rebuild_queues(self.store, tenants, self.agents, self.dispatcher)
            self.admitting = True
            log.info("router %s took the admitter lease; %d READY requeued", self.name, queued)

    # --- the loop ------------------------------------------------------------------------------

    def cycle(self, block_s: float = 0.0) -> bool:
        """Take notices (waiting up to ``block_s`` for the first) and admit what fits.

        Notices are acknowledged once the admitter holds what they asked for, with the next
        take; if this cycle fails before, they stay pending and the next cycle takes them again.

        True when more work is likely waiting (a full batch of notices or of admissions), so
        the caller goes round again at once; otherwise it may block on the feed, which wakes
        it as soon as a turn ends, and then waits ``REINS_ROUTER_GATHER_S`` for more (measured
        on ``reins bench fleet``: about a fifth less router CPU per step at 5 ms). Admission
        figures are written at each tick, not per cycle.
        """
        d = self.dispatcher
        limit = self.options.batch
        notices = self.feed.take(limit, block_s=block_s)
        gather = self.settings.router_gather_s
        if block_s > 0 and gather > 0 and 0 < len(notices) < limit:
            # Idle until a turn ended: take the turns ending meanwhile into this cycle too, so
            # its round trips (requeue, claim, commit, custody, publish) serve several
            # admissions. A few milliseconds against a model call of seconds.
            self._stop.wait(gather)
            notices += self.feed.take(limit - len(notices), more=True)
        d.intake(notices.items)
        self.feed.done(notices)  # queued in the admitter: acknowledged with the next take
        admitted = 0
        while admitted < self.options.batch:
            burst = d.admit_some(SEND_BURST)
            self.outbox.flush()  # a turn waits for at most one burst of admissions
            admitted += burst
            if burst < SEND_BURST:
                break
        if len(d.figures.pending_admissions) >= FLUSH_ADMISSIONS:
            d.flush()
        return len(notices) >= self.options.batch or admitted >= self.options.batch

    def run(self) -> int:
        """Serve until :meth:`stop` (SIGTERM, SIGINT); returns the exit code. A failed tick or
        cycle (Redis unreachable, a bug) is logged and retried after a pause: it never ends
        the process."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
            return_large_blocks()  # ring changes free large arrays: give them back (heap.py)
        log.info("router %s up (admitter %s)", self.name, self.options.admitter.value)
        probes = self._probes()
        every = self.settings.heartbeat_interval_s / 2
        next_tick, busy = 0.0, True
        while not self._stop.is_set():
            self.beat.mark()
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + every
                if self._guarded("tick", self.tick)[0]:
                    self.ticked.mark()
            if not self.admitting:
                self._stop.wait(min(every, 0.2))
                continue
            block_s = 0.0 if busy else min(every, 0.05)
            busy = bool(self._guarded("cycle", partial(self.cycle, block_s))[1])
        self.close()
        if probes is not None:
            probes.stop()
        return 0

    def _guarded(self, what: str, step: Callable[[], object]) -> tuple[bool, object]:
        """Run one step of the loop: (True, its result), or after a failure (logged, then a
        pause) (False, None)."""
        try:
            return True, step()
        except (ReinsError, RedisError) as exc:
            log.error("%s of %s failed: %s", what, self.name, exc)
        except Exception:
            log.exception("%s of %s failed", what, self.name)
        self._stop.wait(FAILED_STEP_PAUSE_S)
        return False, None

    def _probes(self) -> HealthServer | None:
        """/livez: the loop goes round; /readyz: its last tick (which reads Redis) is recent."""
        within = live_within_s(self.settings)
        return serve_probes(
            self.settings,
            live=lambda: self.beat.stale(within),
            ready=lambda: self.ticked.stale(3 * self.settings.heartbeat_interval_s),
        )

    def stop(self) -> None:
        """Ask the loop to end after its current cycle."""
        self._stop.set()

    def close(self) -> None:
        """Give up the lease and the ring report; write what is pending."""
        self.dispatcher.flush()
        self.feed.flush()
        if not self.shared and self.admitting:
            self.lease.release()
        self.membership.retire(self.name)
        f = self.dispatcher.figures
        log.info("router %s stopped: %d admitted, %d requeued", self.name, f.admitted, f.requeued)
