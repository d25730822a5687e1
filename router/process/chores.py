"""The chores of a router's tick, beside the recovery passes and the ticker.

:class:`HandBackRelay` sends turns members gave back unstarted on to another member;
:func:`reconcile_claims` resolves the shared admitter's lapsed claims; :class:`AdmitterLeadership`
lets one router at a time admit while admitters are local to router processes (the others
stand by and take over by rebuilding the queues from the store, :func:`rebuild_queues`);
:class:`FleetReport` tells the observer the membership and the admission figures. The order
they run in is :meth:`router.process.service.RouterService.tick`'s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import redis

from kernel.errors import EmptyRing, ReinsError
from kernel.record import TrajectoryRecord
from kernel.states import ACTING, LifecycleState
from router.admission.fairness import FairnessFigures
from router.admission.local_claims import LocalClaiming
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.claims import store_readiness
from router.fleet.agents import AgentCache
from router.fleet.observe import RouterObserver
from router.placement.membership import Membership, ReplicaRing
from router.process.boot import Outbox
from router.process.dispatch import Dispatcher, placement_key
from router.wire.feed import Feed, route_of
from router.wire.notices import ready_notice
from router.wire.turns import HandBackWhy
from store.base import TrajectoryStore
from store.scripts import scripts_beside

log = logging.getLogger("reins.router")
SCRIPTS = scripts_beside(__file__)
HELD_APPROVALS_EVERY_S = 15.0  # held approvals are counted from the store's index this often


@dataclass
class HandBackRelay:
    """Sends the turns members handed back unstarted on to another member of the ring."""

    feed: Feed
    replica: ReplicaRing
    outbox: Outbox
    batch: int

    def send_on(self) -> int:
        """Send up to ``batch`` handed-back turns on, under the same call ids and gate lease;
        returns how many went. One that no member on the ring may take now waits for the next
        tick (with its refusals forgotten: the fleet may have changed)."""
        entries = self.feed.take_handbacks(self.batch)
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
            self.outbox.turn(member, msg.to_payload())
            sent += 1
            log.info(
                "turn of %s (v%d) handed back by %s (%s) sent on to %s",
                msg.trajectory_id,
                msg.version,
                back.member,
                back.why.value,
                member,
            )
        self.outbox.flush()
        self.feed.settle_handbacks(entries, again=waiting)  # sent on: acknowledged only now
        return sent


def reconcile_claims(admitter: RedisAdmitter, store: TrajectoryStore) -> None:
    """Resolve the shared admitter's claims past their deadline, reading readiness from
    ``store`` (:meth:`router.admission.redis.admitter.RedisAdmitter.reconcile`)."""
    done = admitter.reconcile(store_readiness(store))
    if done.requeued or done.dropped:
        log.info("reconciled claims: %s requeued, %s dropped", done.requeued, done.dropped)


class AdmitterLeadership:
    """The lease in Redis that lets one router admit while admitters are local to routers.

    Correctness never depends on it: two local admitters at once cost fairness, not safety.
    """

    def __init__(self, client: redis.Redis, key: str, name: str, ttl_s: float) -> None:
        self._client, self._key, self._name = client, key, name
        self._ttl_ms = int(ttl_s * 1000)
        self._script = SCRIPTS("admit_lease.lua")

    def renew(self) -> bool:
        """Extend the lease if this router still holds it; False if it was lost."""
        args = [self._name, "renew", self._ttl_ms]
        return bool(self._script.run(self._client, [self._key], args))

    def take(self) -> bool:
        """Take the lease if nobody holds it."""
        return bool(self._client.set(self._key, self._name, nx=True, px=self._ttl_ms))

    def release(self) -> None:
        """Give the lease up, if this router holds it."""
        self._script.run(self._client, [self._key], [self._name, "release", 0])


def rebuild_queues(
    store: TrajectoryStore, tenants: Iterable[str], agents: AgentCache, dispatcher: Dispatcher
) -> int:
    """Queue every READY trajectory from the store (oldest first), count every acting one as a
    turn in flight of its tenant (its ``max_in_flight``, ADR 0123), and take a gate lease for
    every model call in flight (it expires after its ttl, as its holder's would); returns how
    many were queued."""
    records = []
    admitter = dispatcher.admitter
    running = admitter.running if isinstance(admitter, LocalClaiming) else None
    for tenant in tenants:
        for state in (LifecycleState.READY, *sorted(ACTING)):
            for tid in store.list(tenant, state):
                try:
                    records.append(store.load(tenant, tid))
                except ReinsError as exc:
                    log.warning("rebuild skipped %s/%s: %s", tenant, tid, exc)
    records.sort(key=lambda r: r.submitted_at)
    queued = 0
    for rec in records:
        try:
            agent, ctx = agents.get(rec.agent)
        except ReinsError:
            continue
        model = agent.profile.model
        route = route_of(model.provider, model.name)
        if rec.state is LifecycleState.READY:
            dispatcher.requeue(ready_notice(rec, "", time.time(), route, ctx))
            queued += 1
        else:
            _running(rec, route, dispatcher, running)
    return queued


def _running(
    rec: TrajectoryRecord,
    route: str,
    dispatcher: Dispatcher,
    running: Callable[[str, str], None] | None,
) -> None:
    """An acting trajectory found by :func:`rebuild_queues`: a turn in flight of its tenant,
    and a gate lease for its model call in flight."""
    if running is not None:
        running(rec.tenant, rec.trajectory_id)
    gates = dispatcher.gates
    calling = rec.state is LifecycleState.CALLING_MODEL
    if calling and gates is not None and dispatcher.route_for(route):
        gates.debit(route, f"{rec.trajectory_id}/m{rec.turn}", 1)


@dataclass
class FleetReport:
    """Tells an observer the membership, the admission figures and the held approvals."""

    membership: Membership
    tenants: tuple[str, ...]
    _held_counted_at: float = float("-inf")

    def tell(
        self,
        observer: RouterObserver,
        figures: Callable[[], FairnessFigures] | None,
        store: TrajectoryStore,
    ) -> None:
        """The membership; ``figures`` (None: this router does not admit, so it has none);
        every ``HELD_APPROVALS_EVERY_S``, the approvals held per tenant, from ``store``."""
        observer.on_membership(self.membership.records())
        if figures is not None:
            observer.on_figures(figures())
        else:
            observer.forget_figures()
        now = time.monotonic()
        if now - self._held_counted_at >= HELD_APPROVALS_EVERY_S:
            self._held_counted_at = now
            held = LifecycleState.AWAITING_APPROVAL
            observer.on_held_approvals({t: len(store.list(t, held)) for t in self.tenants})
