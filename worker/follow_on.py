"""Follow-on turns: the worker that ended a turn READY admits the trajectory's next turn itself,
when the shared admitter would let that call overtake nobody.

:meth:`FollowOn.admit` settles the ended turn's gate lease and claims the call in one script run in
the shared admitter, steps ``Admit`` on the record in hand, records its custody of the turn and
commits the admission by compare-and-set in one round trip, the claim's confirmation behind it
(run by the server only if that commit applied); the caller runs the turn with the committed
record. When the admitter or the store says no, the call stays READY at its queue head for a
router. Only messages with a ``follow_on`` allowance are continued here, never on a draining
worker, and not past half the visibility timeout. See docs/adr/0041-follow-on-turns.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from kernel.context import KernelContext, StepResult
from kernel.errors import ConcurrentModification, ReinsError, StoreError
from kernel.events import Admit
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.step import step
from router.admission.claims import Claim
from router.admission.gates import NO_SETTLEMENT, GateSettlement
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.fleet import config as fleet_config
from router.fleet.commits import commit
from router.fleet.config import ConfigSource
from router.fleet.observe import AdmissionObserver
from router.wire.custody import Custody
from router.wire.feed import Feed, admission_entry
from router.wire.notices import Notice
from router.wire.turns import TurnMessage, worker_commands
from store.base import prepare_commit
from store.redis_direct import direct_batch
from store.redis_store import RedisStore

log = logging.getLogger("reins.worker.follow_on")
REDEBIT_WAIT_S = (0.05, 1.0)  # first and longest wait between debits of a lapsed claim


class FollowOn:
    """Admits a worker's next turn of a trajectory; one per worker, used from many threads.

    Each call is independent: the admitter and gates objects send scripts over a connection
    pool; the admitter's own fairness book (its figures of this process's confirmations) and the
    counters here are updated under a lock.
    """

    def __init__(
        self,
        *,
        worker: str,
        client: redis.Redis,
        store: RedisStore,
        admitter: RedisAdmitter | None,
        gates: RedisGates,
        custody: Custody,
        feed: Feed,
        max_task_s: float,
        draining: Callable[[], bool],
        clock: Callable[[], float] = time.time,
        observer: AdmissionObserver | None = None,
        document: ConfigSource | None = None,
    ) -> None:
        self.worker, self.store, self.admitter, self.gates = worker, store, admitter, gates
        self.client = client
        # The fleet's document, followed version by version (None: ``admitter`` is fixed).
        self.document = document
        self._version: int | None = None  # the document's version the admitter was set to
        self.custody, self.feed, self.max_task_s = custody, feed, max_task_s
        self.draining, self.clock = draining, clock
        self.observer = observer or AdmissionObserver()
        self.admitted = 0  # follow-on turns admitted here since start
        self.passed = 0  # READY turns left to a router
        self._lock = threading.Lock()

    @classmethod
    def configured(
        cls,
        settings: Settings,
        *,
        worker: str,
        client: redis.Redis,
        store: RedisStore,
        gates: RedisGates,
        custody: Custody,
        feed: Feed,
        draining: Callable[[], bool],
        observer: AdmissionObserver | None = None,
        document: ConfigSource | None = None,
    ) -> FollowOn | None:
        """The chain of a worker with ``settings``: None when ``REINS_FOLLOW_ON_TURNS`` is 0.

        The shared admitter admits by the fleet's document (``document``, or one read from
        ``client``), as every router does, and follows its versions. A tenants file named is
        applied as the document first (:func:`fleet_config.apply_file`); None when that file
        is refused (logged).
        """
        if settings.follow_on_turns <= 0:
            return None
        if settings.tenants_file:
            try:
                fleet_config.apply_file(client, settings.key_prefix, settings.tenants_file)
            except ReinsError as exc:
                log.warning("%s admits no follow-on turns: %s", worker, exc)
                return None
        if document is None:
            document = ConfigSource(client, settings.key_prefix)
        return cls(
            worker=worker,
            client=client,
            store=store,
            admitter=None,
            gates=gates,
            custody=custody,
            feed=feed,
            max_task_s=settings.visibility_timeout_s / 2,
            draining=draining,
            observer=observer,
            document=document,
        )

    def may_follow_on(self, msg: TurnMessage, task_began: float) -> bool:
        """True when this turn's successor may be admitted here (allowance, drain, time)."""
        return (
            msg.follow_on > 0
            and not self.draining()
            and time.monotonic() - task_began < self.max_task_s
        )

    def admit(
        self,
        rec: TrajectoryRecord,
        msg: TurnMessage,
        ready: Notice,
        ctx: KernelContext,
        used_tokens: int,
        pending: StepResult | None = None,
        land: Callable[[], object] | None = None,
    ) -> tuple[StepResult, TurnMessage] | None:
        """Settle the ended turn's lease and admit ``rec``'s next turn here: the admission's
        result and the turn's message, or None (the call is left to a router; the caller
        pushes ``ready``, the READY notice, without the lease). Raises what the store raises
        when the settlement and claim cannot be sent (the caller's notice carries the lease).

        ``pending``: the ended turn's last step, taken on ``rec`` (the stored record) and not
        committed yet, which left the trajectory READY; the admission is then committed
        together with it, one compare-and-set over ``rec``. When the admission is not
        committed, ``land`` (which commits ``pending`` alone) is called before the claim goes
        back to its queue, so a router that takes it finds the trajectory READY; returning
        None without having called it, or raising, leaves ``pending`` to the caller.

        The result's commands may end the run or hold it (the kernel decided that at
        admission); the caller carries them out as a turn's own.
        """
        admitter = self._admitter_now()
        if admitter is None:  # no document applied yet: the routers admit it
            self._count(passed=1)
            return None
        entry = ready.returning(msg.route or None)  # the route its admission checked
        settle = NO_SETTLEMENT
        if msg.lease and msg.route:
            settle = GateSettlement(msg.route, msg.lease, used_tokens)
        _, claim = admitter.claim_returning(entry, settle=settle)
        if claim is None:
            self._count(passed=1)
            return None
        now = self.clock()
        ready_rec = rec if pending is None else pending.record
        result = step(ready_rec, Admit(now=now), ctx)
        commands = worker_commands(result.commands)
        nxt = self._message(result.record, msg, claim.claim_id if commands else "", commands, now)
        # In custody before it commits, in the same round trip, so the reconciler finds the turn
        # if this worker dies from then on.
        custody = self.custody.commands(self.worker, nxt) if commands else []
        confirm = (claim, now) if commands else None
        why, (ran, wait) = self._commit_admission(rec, result, ctx, custody, pending, confirm)
        if why:  # a router takes it from its queue head and decides afresh
            log.info("declined a follow-on turn of %s: %s", rec.trajectory_id, why)
            if custody and result.record is not ready_rec:
                self.custody.release(self.worker, rec.tenant, rec.trajectory_id, nxt.version)
            if pending is not None and land is not None:
                land()
            self._decline(claim)
            self._count(passed=1)
            return None
        if not commands:  # the kernel ended the run or held it at admission: no turn to run
            admitter.withdraw(rec.trajectory_id)  # its debit released with the claim
            self.custody.release(self.worker, rec.tenant, rec.trajectory_id, msg.version)
            return result, nxt
        if ran:
            self._admitted(claim, wait)
        else:  # on a cluster, after a lost round trip, or a reply in error: on its own
            self._confirm_claim(claim, now)
        self._count(admitted=1)
        return result, nxt

    def _admitter_now(self) -> RedisAdmitter | None:
        """The shared admitter by the fleet's document as it stands (looked at again at most
        every refresh of the source): built at the first version seen, reconfigured at each
        later one. None while no document was applied, or while it cannot be read (logged;
        the READY turn is left to a router, which reads the same document)."""
        if self.document is None:
            return self.admitter
        try:
            fleet = self.document.peek()
        except (ReinsError, redis.RedisError) as exc:
            log.warning("%s left a follow-on turn to the routers: %s", self.worker, exc)
            return None
        if fleet is None:
            return None
        with self._lock:
            if fleet.version != self._version:
                if self.admitter is None:
                    self.admitter = RedisAdmitter(
                        self.client,
                        fleet.admission,
                        prefix=self.gates.prefix,
                        gates=self.gates,
                        version=fleet.version,
                    )
                else:
                    self.admitter.reconfigure(fleet.admission, fleet.version)
                self._version = fleet.version
            return self.admitter

    def _shared(self) -> RedisAdmitter:
        """The shared admitter :meth:`admit` found (it returns early without one)."""
        if self.admitter is None:  # pragma: no cover - admit() checked it
            raise StoreError("follow-on turns have no admitter yet")
        return self.admitter

    def _commit_admission(
        self,
        rec: TrajectoryRecord,
        result: StepResult,
        ctx: KernelContext,
        custody: list[tuple[str, ...]],
        pending: StepResult | None,
        confirm: tuple[Claim, float] | None,
    ) -> tuple[str, tuple[bool, float | None]]:
        """Commit the admission ``result`` (after ``pending``, when given) by compare-and-set
        over ``rec``, its ``custody`` entry written first in the same round trip and, when
        ``confirm`` names the claim (and the time it was admitted), that claim's confirmation
        sent behind it, run by the server only if the commit applied (one node). Returns ""
        once committed, else why it was not; and whether the confirmation ran, with the
        claim's wait (None: lapsed), as :meth:`ClaimEnds.confirm_committed` reads its reply
        ((False, None) when it was not sent or not answered)."""
        not_run: tuple[bool, float | None] = (False, None)
        ready = rec if pending is None else pending.record
        if result.record is ready:
            return f"the kernel did not admit it ({result.note})", not_run
        rows = result.rows if pending is None else [*pending.rows, *result.rows]
        prepared = prepare_commit(result.record, rec.record_version, rows)
        after: list[tuple[Any, ...]] = []
        replies: list[Any] = []
        finish: Callable[[Any], tuple[bool, float | None]] | None = None
        if confirm is not None:
            claim, now = confirm
            figures = self.feed.admission_figures(self._entry(claim, now))
            command, finish = self._shared().confirm_committed(
                claim, self.store.commit_mark(prepared), figures
            )
            after.append(command)
        provider = ctx.agent.model.provider
        try:
            commit(
                self.store,
                ready,
                result,
                self.observer,
                provider,
                cas=lambda: self.store.apply(prepared, custody, after, replies),
            )
        except (ConcurrentModification, ReinsError) as exc:
            return str(exc), not_run
        if pending is not None:
            self.observer.on_step_result(rec, pending, provider)
        if finish is None or not replies:  # not sent (a cluster), or its round trip was lost
            return "", not_run
        with self._lock:  # the admitter's fairness book of this process
            return "", finish(replies[0])

    def _confirm_claim(self, claim: Claim, now: float) -> None:
        """Commit the claim and record the admission for the figures, in a round trip of
        their own."""
        pipe = direct_batch(self.client)
        confirmed = self._shared().confirm_on(pipe, claim)
        self.feed.record_admissions([self._entry(claim, now)], pipeline=pipe)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[1:]:
            if isinstance(reply, Exception):
                raise reply
        with self._lock:
            wait = confirmed(replies[0])
        self._admitted(claim, wait)

    def _admitted(self, claim: Claim, wait: float | None) -> None:
        """A confirmation's answer: a claim reaped meanwhile (past its deadline, ``wait`` None)
        is debited again before its call may be sent."""
        if wait is None:
            self._debit_again(claim)
            wait = 0.0
        self.observer.on_admission(claim.call, wait)

    def _message(
        self,
        rec: TrajectoryRecord,
        msg: TurnMessage,
        lease: str,
        commands: tuple[Any, ...],
        now: float,
    ) -> TurnMessage:
        return TurnMessage.of(
            rec,
            commands,
            now,
            sent_by=self.worker,
            lease=lease,
            route=msg.route,
            lease_ttl_s=msg.lease_ttl_s,
            follow_on=msg.follow_on - 1,
        )

    def _count(self, *, admitted: int = 0, passed: int = 0) -> None:
        with self._lock:
            self.admitted += admitted
            self.passed += passed

    def _decline(self, claim: Claim) -> None:
        try:
            self._shared().decline(claim)
        except ReinsError as exc:  # reaped meanwhile: the reconciler requeued it already
            log.warning("could not decline claim %s: %s", claim.claim_id, exc)

    def _debit_again(self, claim: Claim) -> None:
        """A lapsed claim's debit was released: no request leaves without one standing. Past
        ``max_task_s`` without one, the turn is given up (raised; the record keeps its call
        for the stranded-turn backstop), as nothing may be sent."""
        call, wait = claim.call, REDEBIT_WAIT_S[0]
        give_up = time.monotonic() + self.max_task_s
        while call.route and not self.gates.debit(call.route, claim.claim_id, call.charge).ok:
            if time.monotonic() > give_up or self.draining():
                raise StoreError(f"{call.trajectory_id}: no gate debit for its lapsed claim")
            time.sleep(wait)  # the gate's window refills; the dispatcher waits likewise
            wait = min(wait * 2, REDEBIT_WAIT_S[1])

    def _entry(self, claim: Claim, now: float) -> dict[str, Any]:
        """The admission's entry in the figures, as a router's dispatcher writes it."""
        call = claim.call
        return admission_entry(
            call.tenant,
            call.service_class,
            call.charge,
            by=self.worker,
            at=now,
            backlogged=claim.backlogged,
        )
