"""The dispatch loop of a router: READY work in, one admitted turn at a time out to a worker.

An admission loads the record (the truth; a queue entry is only a hint), steps the kernel's
``Admit`` and commits it by compare-and-set, commits the nomination, and only then sends the
turn to the ring's member (register before send). A record no longer READY is withdrawn; a lost
compare-and-set or a record of a schema this build cannot read is declined, so the call stays
READY at its queue head. With the Redis admitter claims, confirmations and requeues are batched, one
script each per burst. :meth:`Dispatcher.intake` folds in the workers' turn-end notices:
requeues READY trajectories and settles the ended turns' gate leases.
Design: ``docs/adr/0005-dispatch-loop.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kernel.errors import (
    ConcurrentModification,
    InvalidInput,
    ReinsError,
    SnapshotNotFound,
    StaleNomination,
    UnsupportedSchema,
)
from kernel.events import Admit, Finalize
from kernel.states import LifecycleState, StopReason
from kernel.step import step
from router.admission import AdmissionQueue
from router.admitter import FinalizeNow
from router.agents import AgentCache
from router.commits import commit
from router.drr import Nomination, ReadyCall
from router.feed import Feed, Notice, NoticeKind, admission_entry
from router.feedback import feedback_from
from router.gates import GateConfig, GateReading, ProviderGates
from router.observe import AdmissionObserver, provider_of
from router.ring import Ring
from router.turn_message import TurnMessage, worker_commands
from store.base import TrajectoryStore

log = logging.getLogger("reins.router.dispatch")
_T = TypeVar("_T")

#: Sends a turn message to a ring member's queue: (member, payload) -> None.
Sender = Callable[[str, dict[str, Any]], None]


#: Up to this many configured tenants each admission is marked with whether every tenant had a
#: call READY (the admissions feed's ``b``). Telling reads every tenant's queue depth (in the
#: claim script, for the shared admitter), so past it the mark is not computed and is False:
#: at 10,000 tenants the read cost 25 ms of Redis per admission (``docs/adr/0191``).
BACKLOG_MARK_UP_TO = 64


def placement_key(tenant: str, trajectory_id: str) -> str:
    """The ring key of a trajectory (tenant-scoped, stable for its whole life)."""
    return f"{tenant}/{trajectory_id}"


def gate_has_room(reading: GateReading, now: float) -> bool:
    """True when one more request fits the gate's counters as read (a hint; the debit decides)."""
    if reading.paused_until > now:
        return False
    if 0 <= reading.concurrency <= reading.leases:
        return False
    return not 0 <= reading.rpm <= reading.requests


@dataclass
class Figures:
    """What one dispatcher did, for logs and the bench."""

    admitted: int = 0
    declined: int = 0
    withdrawn: int = 0
    requeued: int = 0
    settled: int = 0
    pending_admissions: list[dict[str, Any]] = field(default_factory=list)


class Dispatcher:
    """Admits READY trajectories and sends their turns; one per router, one thread.

    ``admitter`` is either admitter (:mod:`router.admission`). With the in-memory one
    (``shared=False``) the gate is debited here, after the nomination and before the
    compare-and-set, and ``depths`` reads its queue depths; the Redis admitter (``shared``)
    debits in its claim and reports depths with it. ``observer`` is told of
    each admission, gate refusal, commit and lost compare-and-set.
    """

    def __init__(
        self,
        *,
        name: str,
        store: TrajectoryStore,
        admitter: AdmissionQueue,
        feed: Feed,
        agents: AgentCache,
        ring: Callable[[], Ring],
        sender: Sender,
        gates: ProviderGates | None = None,
        gate_config: GateConfig | None = None,
        shared: bool = False,
        depths: Callable[[], Sequence[int]] | None = None,
        clock: Callable[[], float] = time.time,
        observer: AdmissionObserver | None = None,
        follow_on_turns: int = 0,
    ) -> None:
        self.name, self.store, self.admitter, self.feed = name, store, admitter, feed
        # Only a worker admitting through the same shared admitter may admit follow-on turns.
        self.follow_on_turns = follow_on_turns if shared else 0
        self.observer = observer or AdmissionObserver()
        self.agents, self.ring, self.sender = agents, ring, sender
        self.gates, self.gate_config, self.shared = gates, gate_config, shared
        self.depths = depths
        self.clock = clock
        self.figures = Figures()
        self._lease_serial = 0
        self._unsent: list[tuple[str, TurnMessage, int]] = []  # lapsed claims awaiting a debit

    # --- intake --------------------------------------------------------------------------------

    def intake(self, notices: Sequence[Notice]) -> None:
        """Settle each notice's gate lease, end its turn in flight, requeue READY trajectories."""
        ready = []
        for n in notices:
            if self.gates is not None and n.lease_route:
                self._settle(self.gates, n)
            if n.kind is NoticeKind.READY:
                ready.append(n)
        self._end_turns(notices)
        if not ready:
            return
        many = getattr(self.admitter, "requeue_many", None)
        if many is None:
            for n in ready:
                self.requeue(n)
            return
        try:
            answers = many([self._entry(n) for n in ready])
        except InvalidInput:  # one bad notice (unknown tenant): take them one by one
            for n in ready:
                self.requeue(n)
            return
        for n, answer in zip(ready, answers, strict=True):
            self._requeued(n, answer)

    def _settle(self, gates: ProviderGates, n: Notice) -> None:
        """Apply what the ended turn's reply said of the provider's quota (429, retry-after,
        remaining requests and tokens), then settle its gate lease: the gate tightens before
        the next claim and recovers as the headers allow (ADR 0121)."""
        if n.feedback and self.route_for(n.lease_route):
            # First, while the lease still holds its slot: no replica's claim comes in between.
            retry = n.retry_after_s if n.retry_after_s >= 0 else None
            gates.observe(n.lease_route, feedback_from(n.rate_limits, retry, time.time()))
        if n.lease:
            gates.settle(n.lease_route, n.lease, n.used_tokens if n.used_tokens >= 0 else None)
            self.figures.settled += 1

    def _end_turns(self, notices: Sequence[Notice]) -> None:
        """The notices' turns leave their tenants' turns in flight (ADR 0123). On the shared
        admitter only a notice that carries its turn's claim (the lease) ends it, and only while
        the entry still names that claim: the notice of a duplicate message, which carries
        none, cannot end the turn that runs now. A local admitter ends every turn's."""
        if self.shared:
            turns = [(n.tenant, n.trajectory_id, n.lease) for n in notices if n.lease]
        else:
            turns = [(n.tenant, n.trajectory_id, "") for n in notices if n.call_id]
        if not turns:
            return
        many = getattr(self.admitter, "release_many", None)
        if many is not None:
            many(turns)
            return
        for tenant, tid, claim in turns:
            self.admitter.release(tenant, tid, claim)

    def requeue(self, n: Notice) -> None:
        """Queue a READY trajectory with its next call's charge; duplicates are ignored."""
        tenant, tid, tokens, allowance, klass, route = self._entry(n)
        try:
            out: Any = self.admitter.requeue(
                tenant,
                tid,
                input_tokens=tokens,
                output_allowance=allowance,
                service_class=klass,
                route=route,
            )
        except InvalidInput as exc:
            out = exc
        self._requeued(n, out)

    def _entry(self, n: Notice) -> tuple[str, str, int, int, str | None, str | None]:
        return n.returning(self.route_for(n.route))

    def _requeued(self, n: Notice, answer: Any) -> None:
        if isinstance(answer, FinalizeNow):
            # A next call over the tenant's largest call can never be admitted: end the run
            # now (bounded latency needs rejection), not leave it waiting.
            log.warning("%s/%s can never be admitted: %s", n.tenant, n.trajectory_id, answer.why)
            self.finalize(n.tenant, n.trajectory_id, answer.stop_reason, answer.why)
        elif isinstance(answer, Exception):  # already queued, most often: a duplicate notice
            log.debug("requeue of %s/%s refused: %s", n.tenant, n.trajectory_id, answer)
        else:
            self.figures.requeued += 1

    def finalize(self, tenant: str, tid: str, stop: StopReason, why: str) -> None:
        """End a trajectory between turns with a stop the admitter decided (by compare-and-set,
        reloading on a lost race); a trajectory already past that point is left alone."""
        for _ in range(8):
            try:
                rec = self.store.load(tenant, tid)
                ctx = self.agents.context(rec.agent)
                result = step(rec, Finalize(now=self.clock(), stop=stop, detail=why), ctx)
            except (SnapshotNotFound, ReinsError) as exc:
                log.info("did not finalize %s/%s: %s", tenant, tid, exc)
                return
            try:
                commit(self.store, rec, result, self.observer, ctx.agent.model.provider)
                return
            except ConcurrentModification:
                continue

    def route_for(self, route: str) -> str | None:
        """The gate route of a call through ``route``, or None when no gate governs it."""
        if route and self.gate_config is not None and route in self.gate_config.routes:
            return route
        return None

    # --- admission -----------------------------------------------------------------------------

    def room(self) -> bool:
        """True when some gate route (or no gate at all) could take one more request."""
        if self.gates is None or self.gate_config is None or not self.gate_config.routes:
            return True
        now = self.clock()
        return any(gate_has_room(self.gates.reading(r), now) for r in self.gate_config.routes)

    def admit_some(self, limit: int) -> int:
        """Admit up to ``limit`` calls; 0 when nothing could be admitted now (wait for news)."""
        if self._unsent and not self._send_unsent():
            return 0
        ring = self.ring()
        if not any(not m.draining for m in ring.members):
            return 0
        marks = self._marks_backlog()
        if self.shared:
            return self._admit_claims(limit, ring, marks)
        admitted = 0
        while admitted < limit and self.room():
            nomination = self.admitter.nominate()
            if nomination is None:
                break
            depths = list(self.depths()) if self.depths is not None and marks else []
            if not self._admit_local(nomination, depths, ring):
                break
            admitted += 1
        return admitted

    def _marks_backlog(self) -> bool:
        """Whether admissions are marked backlogged (at most BACKLOG_MARK_UP_TO tenants)."""
        config = getattr(self.admitter, "config", None)
        return config is None or len(config.tenants) <= BACKLOG_MARK_UP_TO

    def _admit_claims(self, limit: int, ring: Ring, marks: bool) -> int:
        """The shared admitter: claim a batch, admit each, confirm the batch (3 round trips
        beside each trajectory's own load and compare-and-set)."""
        admitter: Any = self.admitter
        batch = admitter.claim_many(limit, 1, depths=marks)
        if batch.refused:
            self.observer.on_gate_refused(
                provider_of(batch.refused_route), batch.reason, batch.refused
            )
        ready: list[tuple[Any, str, TurnMessage, bool]] = []
        for claim in batch.claims:
            prepared = self._prepare(claim, claim.claim_id, ring)
            if prepared is not None:
                member, msg = prepared
                ready.append((claim, member, msg, claim.backlogged))
        if ready:
            waits = admitter.confirm_many([claim for claim, _, _, _ in ready])
            for (claim, member, msg, backlogged), wait in zip(ready, waits, strict=True):
                if wait is None:  # reaped meanwhile: debit again before the request may leave
                    self._unsent.append((member, msg, claim.call.charge))
                    continue
                self._send(claim.call, member, msg, backlogged, wait)
        return len(batch.claims)

    def _admit_local(self, nom: Nomination, depths: list[int], ring: Ring) -> bool:
        """The in-memory admitter: debit the gate here, admit, confirm; False if gated."""
        call = nom.call
        lease = ""
        if call.route and self.gates is not None:
            self._lease_serial += 1
            lease = f"{call.trajectory_id}#{self.name}#{self._lease_serial}"
            debit = self.gates.debit(call.route, lease, call.charge)
            if not debit.ok:
                self.admitter.decline(nom)
                self.figures.declined += 1
                self.observer.on_gate_refused(provider_of(call.route), debit.reason)
                return False
        prepared = self._prepare(nom, lease, ring)
        if prepared is not None:
            wait = self._resolve(self.admitter.confirm, nom)
            backlogged = bool(depths) and all(d > 0 for d in depths)
            self._send(call, *prepared, backlogged, 0.0 if wait is None else wait)
        return True

    def _prepare(self, nom: Nomination, lease: str, ring: Ring) -> tuple[str, TurnMessage] | None:
        """Load, step Admit, compare-and-set: the turn message to send, or None (the nomination
        was declined or withdrawn here)."""
        call = nom.call
        tenant, tid, route = call.tenant, call.trajectory_id, call.route
        began = self.clock()
        try:
            rec = self.store.load(tenant, tid)
            ctx = self.agents.context(rec.agent)
        except UnsupportedSchema as exc:  # a newer build's record: for a router that reads it
            log.warning("declined %s/%s: %s", tenant, tid, exc)
            self._release(route, lease)
            self._resolve(self.admitter.decline, nom)
            self.figures.declined += 1
            return None
        except (SnapshotNotFound, ReinsError) as exc:
            log.warning("withdrew %s/%s: %s", tenant, tid, exc)
            self._withdraw(tid, route, lease)
            return None
        if rec.state is not LifecycleState.READY:
            self._withdraw(tid, route, lease)
            return None
        result = step(rec, Admit(now=self.clock()), ctx)
        if result.record is rec:
            log.info("withdrew %s/%s: %s", tenant, tid, result.note)
            self._withdraw(tid, route, lease)
            return None
        try:
            commit(self.store, rec, result, self.observer, ctx.agent.model.provider)
        except ConcurrentModification:
            self._release(route, lease)
            self._resolve(self.admitter.decline, nom)
            self.figures.declined += 1
            return None
        commands = worker_commands(result.commands)
        if not commands:  # the kernel ended the run, or carried out a hold, at admission
            self._withdraw(tid, route, lease)
            return None
        msg = TurnMessage.of(
            result.record,
            commands,
            self.clock(),
            sent_by=self.name,
            lease=lease,
            route=route,
            lease_ttl_s=self._lease_ttl(route) if lease else 0.0,
            follow_on=self.follow_on_turns,
            trace=self.observer.tracer.admitted(result.record, began, self.name),
        )
        return ring.lookup(placement_key(tenant, tid)), msg

    def _lease_ttl(self, route: str | None) -> float:
        """How often the worker must renew the turn's gate lease (0: the route has no gate)."""
        limits = self.gate_config.routes.get(route) if route and self.gate_config else None
        return limits.lease_ttl_s if limits is not None else 0.0

    def _send(
        self, call: ReadyCall, member: str, msg: TurnMessage, backlogged: bool, wait_s: float
    ) -> None:
        entry = admission_entry(
            call.tenant,
            call.service_class,
            call.charge,
            by=self.name,
            at=msg.admitted_at,
            backlogged=backlogged,
        )
        entry["id"], entry["v"] = call.trajectory_id, msg.version
        entry["w"] = round(wait_s, 4)  # the admission wait (GET /v1/usage reads it)
        self.figures.pending_admissions.append(entry)
        self.figures.admitted += 1
        self.observer.on_admission(call, wait_s)
        self.sender(member, msg.to_payload())

    def _send_unsent(self) -> bool:
        """Send turns whose claim lapsed once their debit stands again; True when none waits."""
        waiting = []
        for member, msg, charge in self._unsent:
            gates = self.gates
            if gates is not None and msg.route and not gates.debit(msg.route, msg.lease, charge).ok:
                waiting.append((member, msg, charge))
                continue
            self.sender(member, msg.to_payload())
        self._unsent = waiting
        return not waiting

    def _withdraw(self, trajectory_id: str, route: str, lease: str) -> None:
        if not self.shared:
            self._release(route, lease)  # the Redis admitter releases a claim's debit itself
        self.admitter.withdraw(trajectory_id)
        self.figures.withdrawn += 1

    def _release(self, route: str, lease: str) -> None:
        if lease and route and self.gates is not None and not self.shared:
            self.gates.release(route, lease)

    @staticmethod
    def _resolve(fn: Callable[[Nomination], _T], nom: Nomination) -> _T | None:
        try:
            return fn(nom)
        except StaleNomination as exc:
            log.warning("nomination of %s already resolved: %s", nom.call.trajectory_id, exc)
            return None

    def flush(self) -> None:
        """Write the admissions recorded since the last flush (one round trip)."""
        pending, self.figures.pending_admissions = self.figures.pending_admissions, []
        self.feed.record_admissions(pending)
