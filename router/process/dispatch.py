"""The dispatch loop of a router: READY work in, one admitted turn at a time out to a worker.

An admission loads the record (the truth; a queue entry is only a hint), steps the kernel's
``Admit`` and commits it by compare-and-set, commits the nomination, and only then sends the
turn to the ring's member (register before send). A record no longer READY is withdrawn; a lost
compare-and-set or a record of a schema this build cannot read is declined, so the call stays
READY at its queue head. The admitter is :class:`~router.admission.claims.Claiming`: the shared
one in Redis batches claims, confirmations and requeues, one script each per burst; one in
process claims a call at a time. :meth:`Dispatcher.intake` folds in the workers' turn-end notices:
requeues READY trajectories and settles the ended turns' gate leases.
Design: ``docs/adr/0005-dispatch-loop.md``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from router.admission.claims import Claim, Claiming, EndedTurn, Requeued, ReturningCall
from router.admission.drr import ReadyCall
from router.admission.feedback import feedback_from
from router.admission.gates import GateConfig, ProviderGates
from router.admission.queue import FinalizeNow
from router.fleet.agents import AgentCache
from router.fleet.commits import commit
from router.fleet.episodes import Episodes
from router.fleet.observe import AdmissionObserver, provider_of
from router.placement.ring import Ring
from router.wire.feed import Feed, admission_entry
from router.wire.notices import Notice, NoticeKind
from router.wire.turns import TurnMessage, worker_commands
from store.base import TrajectoryStore
from store.memory_base import MemoryBank

log = logging.getLogger("reins.router.dispatch")

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

    ``admitter`` claims the calls, each with its gate debit (:mod:`router.admission.claims`);
    ``gates`` settle the leases the turns' notices give back. ``observer`` is told of each
    admission, gate refusal, commit and lost compare-and-set.
    """

    def __init__(
        self,
        *,
        name: str,
        store: TrajectoryStore,
        admitter: Claiming,
        feed: Feed,
        agents: AgentCache,
        ring: Callable[[], Ring],
        sender: Sender,
        gates: ProviderGates | None = None,
        gate_config: GateConfig | None = None,
        clock: Callable[[], float] = time.time,
        observer: AdmissionObserver | None = None,
        follow_on_turns: int = 0,
        memory: MemoryBank | None = None,
    ) -> None:
        self.name, self.store, self.admitter, self.feed = name, store, admitter, feed
        # Only a worker admitting through the same shared admitter may admit follow-on turns.
        self.follow_on_turns = follow_on_turns if admitter.admits_follow_ons else 0
        self.observer = observer or AdmissionObserver()
        self.agents, self.ring, self.sender = agents, ring, sender
        self.gates, self.gate_config = gates, gate_config
        self.clock = clock
        self.episodes = Episodes(memory, clock)  # of the runs it ends (router-decided stops)
        self.figures = Figures()
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
        ended = [
            EndedTurn(n.tenant, n.trajectory_id, n.lease, n.call_id)
            for n in notices
            if n.lease or n.call_id
        ]
        if ended:  # they leave their tenants' turns in flight (ADR 0123)
            self.admitter.end_turns(ended)
        if not ready:
            return
        try:
            answers = self.admitter.requeue_many([self._entry(n) for n in ready])
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

    def requeue(self, n: Notice) -> None:
        """Queue a READY trajectory with its next call's charge; duplicates are ignored."""
        call = self._entry(n)
        try:
            answer: Requeued = self.admitter.requeue(
                call.tenant,
                call.trajectory_id,
                input_tokens=call.input_tokens,
                output_allowance=call.output_allowance,
                service_class=call.service_class,
                route=call.route,
            )
        except InvalidInput as exc:
            answer = exc
        self._requeued(n, answer)

    def _entry(self, n: Notice) -> ReturningCall:
        return n.returning(self.route_for(n.route))

    def _requeued(self, n: Notice, answer: Requeued) -> None:
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
        reloading on a lost race), sending its closing call, if its agent declares closing
        work, to a worker; a trajectory already past that point is left alone."""
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
            except ConcurrentModification:
                continue
            commands = worker_commands(result.commands)
            if commands:  # the agent's closing step (kernel.finalizing): a turn like any other
                msg = TurnMessage.of(result.record, commands, self.clock(), sent_by=self.name)
                self.sender(self.ring().lookup(placement_key(tenant, tid)), msg.to_payload())
                return  # the turn that runs it ends the run
            self.episodes.after(result, ctx.agent)
            return

    def route_for(self, route: str) -> str | None:
        """The gate route of a call through ``route``, or None when no gate governs it."""
        if route and self.gate_config is not None and route in self.gate_config.routes:
            return route
        return None

    # --- admission -----------------------------------------------------------------------------

    def admit_some(self, limit: int) -> int:
        """Admit up to ``limit`` calls; 0 when nothing could be admitted now (wait for news)."""
        if self._unsent and not self._send_unsent():
            return 0
        ring = self.ring()
        if not any(not m.draining for m in ring.members):
            return 0
        marks = self._marks_backlog()
        claimed = 0
        while claimed < limit:
            batch = self.admitter.claim_many(limit - claimed, 1, depths=marks)
            if batch.refused:
                self.figures.declined += batch.refused
                provider = provider_of(batch.refused_route)
                self.observer.on_gate_refused(provider, batch.reason, batch.refused)
            claimed += len(batch.claims)
            self._admit_claims(batch.claims, ring)
            if not batch.more or not batch.claims:
                break
        return claimed

    def _marks_backlog(self) -> bool:
        """Whether admissions are marked backlogged (at most BACKLOG_MARK_UP_TO tenants)."""
        return self.admitter.tenant_count() <= BACKLOG_MARK_UP_TO

    def _admit_claims(self, claims: Sequence[Claim], ring: Ring) -> None:
        """Admit each claim (load, step, compare-and-set), confirm those admitted together,
        then send their turns: the shared admitter's burst is 3 round trips beside each
        trajectory's own load and compare-and-set."""
        ready: list[tuple[Claim, str, TurnMessage]] = []
        for claim in claims:
            prepared = self._prepare(claim, ring)
            if prepared is not None:
                ready.append((claim, *prepared))
        if not ready:
            return
        waits = self.admitter.confirm_many([claim for claim, _, _ in ready])
        for (claim, member, msg), wait in zip(ready, waits, strict=True):
            if wait is None:  # reaped meanwhile: debit again before the request may leave
                self._unsent.append((member, msg, claim.call.charge))
                continue
            self._send(claim.call, member, msg, claim.backlogged, wait)

    def _prepare(self, claim: Claim, ring: Ring) -> tuple[str, TurnMessage] | None:
        """Load, step Admit, compare-and-set: the member and turn message to send, or None
        (the claim was declined or withdrawn here)."""
        call, lease = claim.call, claim.claim_id
        tenant, tid, route = call.tenant, call.trajectory_id, call.route
        began = self.clock()
        try:
            rec = self.store.load(tenant, tid)
            ctx = self.agents.context(rec.agent)
        except UnsupportedSchema as exc:  # a newer build's record: for a router that reads it
            log.warning("declined %s/%s: %s", tenant, tid, exc)
            self._decline(claim)
            return None
        except (SnapshotNotFound, ReinsError) as exc:
            log.warning("withdrew %s/%s: %s", tenant, tid, exc)
            self._withdraw(claim)
            return None
        if rec.state is not LifecycleState.READY:
            self._withdraw(claim)
            return None
        result = step(rec, Admit(now=self.clock()), ctx)
        if result.record is rec:
            log.info("withdrew %s/%s: %s", tenant, tid, result.note)
            self._withdraw(claim)
            return None
        try:
            commit(self.store, rec, result, self.observer, ctx.agent.model.provider)
        except ConcurrentModification:
            self._decline(claim)
            return None
        commands = worker_commands(result.commands)
        if not commands:  # the kernel ended the run, or carried out a hold, at admission
            self.episodes.after(result, ctx.agent)
            self._withdraw(claim)
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

    def _withdraw(self, claim: Claim) -> None:
        self.admitter.withdraw_claim(claim)
        self.figures.withdrawn += 1

    def _decline(self, claim: Claim) -> None:
        try:
            self.admitter.decline_claim(claim)
        except StaleNomination as exc:
            log.warning("claim of %s already resolved: %s", claim.call.trajectory_id, exc)
        self.figures.declined += 1

    def flush(self) -> None:
        """Write the admissions recorded since the last flush (one round trip)."""
        pending, self.figures.pending_admissions = self.figures.pending_admissions, []
        self.feed.record_admissions(pending)
