"""A router process: the ring, the ready feed and the dispatch loop (``reins router``).

Boot (:class:`RouterService`): settings, one Redis client for the store, the membership, the
feed and the admitter; the tenant and gate configurations from files; a Celery app that only
sends. Then, until SIGTERM:

* every ``REINS_HEARTBEAT_INTERVAL_S / 2``, a *tick*: rebuild the ring if the membership
  changed and publish it (so drains are acknowledged), send the turns members handed back
  unstarted on to another member (a drain that ran out of grace, a record of a newer schema:
  :class:`router.feed.HandBack`), reconcile lapsed claims, recover the turns held by a
  member whose heartbeat lapsed (:mod:`router.reconcile`; every turn message sent is
  recorded in its member's holdings first), and, as a slow backstop, turns stranded with no
  holding (:mod:`router.stranded`); and every ``TICK_EVERY_S``, the kernel's ``Tick`` for
  waiting trajectories, so wall-clock limits and approval expiry take effect
  (:mod:`router.ticker`);
* otherwise a *cycle*: take notices from the feed, settle and requeue, admit what fits.

An observer (:class:`router.observe.RouterObserver`, Prometheus metrics from ``ops``) is
told the tenants at boot, each admission, gate refusal and commit as it happens, and the
admitter's figures and the membership at each tick (held approvals every
``HELD_APPROVALS_EVERY_S``).

Two router processes run side by side. With the shared admitter (``--admitter redis``, the
default) both admit from the same Redis queues and gates, and neither can admit a call twice
(the claim is atomic and the kernel's admission is a compare-and-set). With an admitter local
to the process (``drr`` or ``fifo``, for comparison and for a Redis without the admitter's
scripts), only the holder of a lease in Redis admits; the other stands by, serving the ring,
and takes over within ``REINS_ADMITTER_LEASE_S`` by rebuilding the queues from the store.
Correctness never depends on the lease: two admitters at once cost fairness, not safety.

SIGTERM: stop the loop, give up the lease, retire the ring report, exit 0. A router holds no
turn: a claim it leaves uncommitted is reaped by the other router's reconciler.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import tomllib
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kernel.errors import ConfigError, EmptyRing, ReinsError
from kernel.settings import Settings
from kernel.states import LifecycleState
from router.admitter import Admitter
from router.agents import AgentCache
from router.broker import TaskPublisher, make_app
from router.dispatch import Dispatcher, Sender, placement_key
from router.feed import Feed, HandBackWhy, ready_notice, route_of
from router.fifo import FifoAdmitter
from router.gates import GateConfig, MemoryGates
from router.membership import Membership, ReplicaRing
from router.observe import RouterObserver
from router.reconcile import Holdings, Reconciler
from router.redis_admitter import RedisAdmitter, store_readiness
from router.redis_gates import RedisGates
from router.stranded import StrandedTurns
from router.submit import RouterApi
from router.tenants import AdmissionConfig
from router.ticker import Ticker
from store.redis_client import client_from_url
from store.redis_store import RedisStore

log = logging.getLogger("reins.router")
_LEASE = Path(__file__).with_name("admit_lease.lua")
SEND_BURST = 16  # admissions whose turn messages go out in one pipelined batch
FLUSH_ADMISSIONS = 512  # admission figures written at once between ticks
TICK_EVERY_S = 5.0  # how often waiting trajectories are told the time (router.ticker)
HELD_APPROVALS_EVERY_S = 15.0  # held approvals are counted from the store's index this often


class AdmitterKind(StrEnum):
    """Which admitter a router runs."""

    REDIS = "redis"  # shared by every router (weighted DRR, gates in Redis)
    DRR = "drr"  # weighted DRR in this process; one router admits at a time
    FIFO = "fifo"  # first come, first served in this process (the fairness peer)


@dataclass
class RouterOptions:
    """What ``reins router`` is told beyond the settings."""

    name: str
    tenants_file: str
    gates_file: str = ""
    admitter: AdmitterKind = AdmitterKind.REDIS
    claim_ttl_s: float = 30.0
    batch: int = 256


def load_gate_config(path: str) -> GateConfig | None:
    """The gate configuration in ``path`` (.toml or .json), or None when no file is named."""
    if not path:
        return None
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
        data = tomllib.loads(raw) if p.suffix == ".toml" else json.loads(raw)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"gate configuration {p}: {exc}") from None
    return GateConfig.from_mapping(data)


class RouterService:
    """One router process (see the module docstring)."""

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
        self._held_counted_at = float("-inf")
        self.client = client if client is not None else client_from_url(settings.redis_url)
        prefix = settings.key_prefix
        self.store = RedisStore(
            self.client, prefix=prefix, retry_attempts=settings.redis_retry_attempts
        )
        self.feed = Feed(self.client, prefix)
        self.membership = Membership(
            self.client, prefix, heartbeat_timeout_s=settings.heartbeat_timeout_s
        )
        self.replica = ReplicaRing(self.membership, options.name)
        if not options.tenants_file:
            raise ConfigError(
                "REINS_TENANTS_FILE (or --tenants) must name the tenant configuration"
            )
        self.config = AdmissionConfig.from_file(options.tenants_file)
        self.observer.on_config(self.config)
        self.gate_config = load_gate_config(options.gates_file)
        self.agents = AgentCache()
        self.holdings = Holdings(self.client, prefix)
        self._batch: TaskPublisher | None = None
        if sender is None:
            broker = redis.Redis.from_url(settings.broker_url, retry=Retry(NoBackoff(), 0))
            self._batch = TaskPublisher(make_app(settings), broker, settings)
            sender = self.holdings.buffering(self._batch.turn)  # flushed before the batch
            self._send_now: Sender = self.holdings.sending(self._batch.send)
        else:
            sender = self._send_now = self.holdings.sending(sender)
        self.sender = sender
        self.shared = options.admitter is AdmitterKind.REDIS
        self.admitting = self.shared
        self._lease = self.client.register_script(_LEASE.read_text())
        self._stop = threading.Event()
        self.dispatcher = self._dispatcher()
        api = self.api()
        self.stranded = StrandedTurns(
            api,
            tuple(t.name for t in self.config.tenants),
            after_s=2 * settings.visibility_timeout_s,
            clock=time.monotonic,
        )
        self.ticker = Ticker(
            api, tuple(t.name for t in self.config.tenants), TICK_EVERY_S, clock=time.time
        )
        self.reconciler = Reconciler(
            api,
            self.membership,
            self.holdings,
            ring=lambda: self.replica.ring,
            by=options.name,
            backstop=self.stranded,
        )

    # --- parts ---------------------------------------------------------------------------------

    def _dispatcher(self) -> Dispatcher:
        """A dispatcher over a fresh admitter (and, when local, fresh gates)."""
        prefix, gate_config = self.settings.key_prefix, self.gate_config
        if self.shared:
            gates = RedisGates(self.client, gate_config or GateConfig(routes={}), prefix=prefix)
            gates.configure()
            redis_admitter = RedisAdmitter(
                self.client,
                self.config,
                prefix=prefix,
                gates=gates,
                claim_ttl_s=self.options.claim_ttl_s,
            )
            return self._with(redis_admitter, gates, None)
        local_gates = MemoryGates(gate_config, time.time) if gate_config else None
        if self.options.admitter is AdmitterKind.FIFO:
            fifo = FifoAdmitter(self.config, time.time)
            return self._with(fifo, local_gates, fifo.depths)
        drr = Admitter(self.config, time.time)
        return self._with(drr, local_gates, lambda: [lane.queued for lane in drr.state.lanes])

    def _with(self, admitter: Any, gates: Any, depths: Any) -> Dispatcher:
        return Dispatcher(
            name=self.name,
            store=self.store,
            admitter=admitter,
            feed=self.feed,
            agents=self.agents,
            ring=lambda: self.replica.ring,
            sender=self.sender,
            gates=gates,
            gate_config=self.gate_config,
            shared=self.shared,
            depths=depths,
            observer=self.observer,
            chain_turns=self.settings.chain_turns,
        )

    def api(self) -> RouterApi:
        """Submission, control and approvals through this router."""
        return RouterApi(
            store=self.store,
            feed=self.feed,
            config=self.config,
            agents=self.agents,
            gate_config=self.gate_config,
            admitter=self.dispatcher.admitter if self.shared else None,
            sender=self._send_now,
            ring=lambda: self.replica.ring,
            observer=self.observer,
        )

    # --- the loop ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Ring refresh and publication; stranded turns; the lease or the claims' reconciler;
        the admission figures gathered since the last tick."""
        self.dispatcher.flush()
        self.replica.refresh()
        self.send_on_handbacks()
        self.reconciler.tick()  # lapsed members' turns, then the stranded-turn backstop
        self.ticker.tick()  # time for waiting trajectories (every TICK_EVERY_S)
        if self.shared:
            admitter: Any = self.dispatcher.admitter
            done = admitter.reconcile(store_readiness(self.store))
            if done.requeued or done.dropped:
                log.info("reconciled claims: %s requeued, %s dropped", done.requeued, done.dropped)
        else:
            self._hold_lease()
        if self.observing:
            self.observe(self.observer)

    def observe(self, observer: RouterObserver) -> None:
        """Tell ``observer`` the membership and, while this router admits, the admitter's
        figures; every ``HELD_APPROVALS_EVERY_S``, the approvals held per tenant."""
        observer.on_membership(self.membership.records())
        if self.admitting:
            observer.on_figures(self.dispatcher.admitter.figures())
        else:
            observer.forget_figures()
        now = time.monotonic()
        if now - self._held_counted_at >= HELD_APPROVALS_EVERY_S:
            self._held_counted_at = now
            held = LifecycleState.AWAITING_APPROVAL
            observer.on_held_approvals(
                {t.name: len(self.store.list(t.name, held)) for t in self.config.tenants}
            )

    def send_on_handbacks(self) -> int:
        """Send the turns members gave back unstarted on to another member, under the same
        call ids and gate lease; returns how many went. One that no member on the ring may take
        now waits for the next tick (with its refusals forgotten: the fleet may have changed)."""
        entries = self.feed.take_handbacks(self.options.batch)
        if not entries:
            return 0
        ring, waiting, sent = self.replica.ring, [], 0
        for back in entries:
            msg = back.message
            exclude = frozenset(msg.refused_by)
            if back.why is HandBackWhy.DRAINING:
                exclude |= {back.member}
            try:
                member = ring.lookup_excluding(
                    placement_key(msg.tenant, msg.trajectory_id), exclude
                )
            except EmptyRing as exc:
                log.warning(
                    "turn of %s handed back by %s waits: %s", msg.trajectory_id, back.member, exc
                )
                waiting.append(replace(back, message=replace(msg, refused_by=())))
                continue
            self.sender(member, msg.to_payload())
            sent += 1
            log.info(
                "turn of %s (v%d) handed back by %s (%s) sent on to %s",
                msg.trajectory_id,
                msg.version,
                back.member,
                back.why.value,
                member,
            )
        self._send_buffered()
        self.feed.hand_back(*waiting)
        return sent

    def _send_buffered(self) -> None:
        """Register before send: the buffered holdings first, then the buffered messages."""
        self.holdings.flush()
        if self._batch is not None:
            self._batch.flush()

    def cycle(self, block_s: float = 0.0) -> bool:
        """Take notices (waiting up to ``block_s`` for the first) and admit what fits.

        True when more work is likely waiting (a full batch of notices or of admissions), so
        the caller goes round again at once; otherwise it may block on the feed, which wakes
        it as soon as a turn ends, and then waits ``REINS_ROUTER_GATHER_S`` for more (measured
        on ``reins bench fleet``: about a fifth less router CPU per step at 5 ms). Admission
        figures are written at each tick, not per cycle.
        """
        d = self.dispatcher
        limit = self.options.batch
        notices = self.feed.pop(limit, block_s=block_s)
        gather = self.settings.router_gather_s
        if block_s > 0 and gather > 0 and 0 < len(notices) < limit:
            # Idle until a turn ended: take the turns ending meanwhile into this cycle too, so
            # its round trips (requeue, claim, commit, holdings, publish) serve several
            # admissions. A few milliseconds against a model call of seconds.
            self._stop.wait(gather)
            notices += self.feed.pop(limit - len(notices))
        d.intake(notices)
        admitted = 0
        while admitted < self.options.batch:
            burst = d.admit_some(SEND_BURST)
            self._send_buffered()  # a turn waits for at most one burst of admissions
            admitted += burst
            if burst < SEND_BURST:
                break
        if len(d.figures.pending_admissions) >= FLUSH_ADMISSIONS:
            d.flush()
        return len(notices) >= self.options.batch or admitted >= self.options.batch

    def run(self) -> int:
        """Serve until :meth:`stop` (SIGTERM, SIGINT); returns the exit code."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
            signal.signal(signal.SIGINT, lambda *_: self.stop())
        log.info("router %s up (admitter %s)", self.name, self.options.admitter.value)
        every = self.settings.heartbeat_interval_s / 2
        next_tick, busy = 0.0, True
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                try:
                    self.tick()
                except ReinsError as exc:
                    log.error("tick of %s failed: %s", self.name, exc)
                next_tick = now + every
            if not self.admitting:
                self._stop.wait(min(every, 0.2))
                continue
            try:
                busy = self.cycle(block_s=0.0 if busy else min(every, 0.05))
            except ReinsError as exc:
                log.error("cycle of %s failed: %s", self.name, exc)
                busy = False
        self.close()
        return 0

    def stop(self) -> None:
        """Ask the loop to end after its current cycle."""
        self._stop.set()

    def close(self) -> None:
        """Give up the lease and the ring report; write what is pending."""
        self.dispatcher.flush()
        if not self.shared and self.admitting:
            self._lease(keys=[self.feed.lease_key], args=[self.name, "release", 0])
        self.membership.retire(self.name)
        f = self.dispatcher.figures
        log.info("router %s stopped: %d admitted, %d requeued", self.name, f.admitted, f.requeued)

    # --- the lease of a local admitter ---------------------------------------------------------

    def _hold_lease(self) -> None:
        ttl_ms = int(self.settings.admitter_lease_s * 1000)
        key = self.feed.lease_key
        if self.admitting:
            if not self._lease(keys=[key], args=[self.name, "renew", ttl_ms]):
                log.warning("router %s lost the admitter lease; standing by", self.name)
                self.admitting = False
                self.dispatcher = self._dispatcher()
            return
        if self.client.set(key, self.name, nx=True, px=ttl_ms):
            self.dispatcher = self._dispatcher()
            queued = self._rebuild()
            self.admitting = True
            log.info("router %s took the admitter lease; %d READY requeued", self.name, queued)

    def _rebuild(self) -> int:
        """Queue every READY trajectory from the store (oldest first) and take a gate lease for
        every turn in flight (it expires after its ttl, as its holder's would)."""
        records = []
        gates = self.dispatcher.gates
        for t in self.config.tenants:
            for state in (LifecycleState.READY, LifecycleState.CALLING_MODEL):
                for tid in self.store.list(t.name, state):
                    try:
                        records.append(self.store.load(t.name, tid))
                    except ReinsError as exc:
                        log.warning("rebuild skipped %s/%s: %s", t.name, tid, exc)
        records.sort(key=lambda r: r.submitted_at)
        queued = 0
        for rec in records:
            try:
                model = self.agents.get(rec.agent)[0].profile.model
            except ReinsError:
                continue
            route = route_of(model.provider, model.name)
            if rec.state is LifecycleState.READY:
                self.dispatcher.requeue(ready_notice(rec, "", time.time(), route))
                queued += 1
            elif gates is not None and self.dispatcher.route_for(route):
                gates.debit(route, f"{rec.trajectory_id}/m{rec.turn}", 1)
        return queued
