"""The admitter in Redis: every router replica admits from the same queues, none twice.

Same contract as the in-memory :class:`~router.admission.local.Admitter`
(:mod:`router.admission.queue`). A nomination here is a
:class:`~router.admission.claims.Claim`: the call is out of its queue and its gate debited
until the claim ends exactly once, by :meth:`~RedisAdmitter.confirm`,
:meth:`~RedisAdmitter.decline`, a :meth:`~RedisAdmitter.withdraw` of its trajectory, or
:meth:`~RedisAdmitter.reconcile` after its deadline (``claim_ttl_s``). A confirmation that finds its
claim reaped raises :class:`~kernel.errors.ClaimLapsed`: debit the gate again before sending.
:class:`RedisAdmitter` is a facade over one part per job (``router/admission/redis/``,
:mod:`router.admission.redis.lapsed`). Design: ``docs/adr/0003-redis-admitter-claims.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from kernel.budget import Budget
from kernel.errors import ConfigError, SubmissionRefused
from router.admission.claims import AdmissionRecord, Claim, ClaimBatch, EndedTurn, ReturningCall
from router.admission.drr import Nomination, ReadyCall
from router.admission.fairness import FairnessFigures
from router.admission.gates import NO_SETTLEMENT, GateSettlement
from router.admission.local import Clock
from router.admission.queue import AdmissionQueue, FinalizeNow
from router.admission.redis.claiming import FollowOnClaims, RedisClaims
from router.admission.redis.claims import ClaimAttempt, Readiness, Reconciled, store_readiness
from router.admission.redis.confirms import ClaimEnds
from router.admission.redis.figures import RedisFigures
from router.admission.redis.gates import RedisGates
from router.admission.redis.in_flight import InFlightPage, TurnsInFlight
from router.admission.redis.lapsed import LapsedClaims
from router.admission.redis.queue import RedisQueue
from router.admission.redis.state import AdmitterState
from router.admission.tenants import AdmissionConfig
from store.redis_client import Batch
from store.redis_store import CommitMark

__all__ = [
    "Claim",
    "ClaimAttempt",
    "ClaimBatch",
    "Reconciled",
    "RedisAdmitter",
    "store_readiness",
]


class RedisAdmitter(AdmissionQueue):
    """The admitter over Redis; one instance per owner (not thread-safe), any number per fleet.

    Construction installs the configuration as ``version`` (:meth:`AdmitterState.install`):
    version 0 (a file) must be the one the state holds (:class:`ConfigError` otherwise);
    a newer version of the fleet's document reconfigures the live state, and
    :meth:`reconfigure` does so while it runs. ``gates`` must be configured
    (:meth:`RedisGates.configure`) under the same prefix; a call with a route is refused at
    submission unless ``gates`` knows it.
    """

    admits_follow_ons = True  # every router and worker shares it

    def __init__(
        self,
        client: redis.Redis,
        config: AdmissionConfig,
        *,
        prefix: str = "reins",
        clock: Clock | None = None,
        gates: RedisGates | None = None,
        claim_ttl_s: float = 30.0,
        version: int = 0,
    ) -> None:
        if gates is not None and gates.prefix != prefix:
            raise ConfigError(f"gates use prefix {gates.prefix!r}, the admitter {prefix!r}")
        if claim_ttl_s <= 0:
            raise ConfigError("claim_ttl_s must be positive")
        state = AdmitterState(client, config, prefix=prefix, clock=clock, claim_ttl_s=claim_ttl_s)
        self.config = config
        self.tag = state.tag
        self.gates = gates
        self._client = client
        self._queue = RedisQueue(state, gates)
        self._claims = RedisClaims(state)
        self._follow_on = FollowOnClaims(state, gates)
        self._figures = RedisFigures(state)
        self._ends = ClaimEnds(state, self._figures.record)
        self._lapsed = LapsedClaims(state)
        self._in_flight = TurnsInFlight(state)
        self._state = state
        state.install(config, version)

    def reconfigure(self, config: AdmissionConfig, version: int) -> bool:
        """Admit by ``config`` from now on, version ``version`` of the fleet's document: the
        shared state is reconfigured unless it already holds this version or a newer one
        (True when this call wrote it). Every replica admits by the state's weights, so from
        the first replica's call on all of them do. Design: ``docs/adr/0120-live-configuration.md``.
        """
        wrote = self._state.install(config, version)
        self.config = config
        return wrote

    # --- edge: validated entry ----------------------------------------------------------------

    def submit(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        input_tokens: int,
        output_allowance: int,
        service_class: str | None = None,
        budget: Budget | None = None,
        route: str | None = None,
    ) -> ReadyCall:
        """Queue a new trajectory's first call, or refuse it changing nothing (as Admitter)."""
        return self._queue.submit(
            tenant,
            trajectory_id,
            input_tokens=input_tokens,
            output_allowance=output_allowance,
            service_class=service_class,
            budget=budget,
            route=route,
        )

    def requeue(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        input_tokens: int,
        output_allowance: int,
        service_class: str | None = None,
        route: str | None = None,
    ) -> ReadyCall | FinalizeNow:
        """Queue a trajectory back at READY, never refused for a full queue (as Admitter)."""
        entry = ReturningCall(
            tenant, trajectory_id, input_tokens, output_allowance, service_class, route
        )
        return self._queue.requeue(entry)

    def requeue_many(
        self, calls: Iterable[ReturningCall]
    ) -> list[ReadyCall | FinalizeNow | SubmissionRefused]:
        """:meth:`requeue` for several trajectories in one round trip; per call, its answer.

        Unknown tenants and classes and malformed calls raise before anything is queued; a
        trajectory already queued is answered with its :class:`SubmissionRefused`.
        """
        return self._queue.requeue_many(calls)

    def claim_returning(
        self, call: ReturningCall, *, settle: GateSettlement = NO_SETTLEMENT
    ) -> tuple[bool, Claim | None]:
        """Queue a trajectory back at READY, then claim it at once if that overtakes nobody.

        For the worker that just ended the trajectory's turn (:mod:`worker.follow_on`), in one
        script run, so no router claims the call in between: a call with a gate is claimed only
        if DRR picks it next, one without is claimed at once; the claim counts as a router's does.
        ``settle``: the ended turn's (route, lease id, tokens used or -1), settled first (as
        :meth:`RedisGates.settle`) whatever the answer. Returns (queued, claim):
        ``(True, None)``, queued but another call comes first or its gate refused (a router
        admits it); ``(False, None)``, not queued (already queued, or over the tenant's largest
        call: the router's requeue decides).
        """
        return self._follow_on.claim_returning(call, settle=settle)

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a trajectory out, queued or claimed (its claim dropped); False if absent."""
        return self._queue.withdraw(trajectory_id)

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits in a queue or is claimed and not yet confirmed."""
        return self._queue.is_queued(trajectory_id)

    # --- hot path -----------------------------------------------------------------------------

    def nominate(self) -> Claim | None:
        """Claim the next call that passes its gate, or None (nothing queued, or all gated)."""
        return self._claims.nominate()

    def claim(
        self,
        tries: int = 0,
        *,
        depths: bool = False,
        expect: str = "",
        skip: Sequence[int] = (),
        closed: Sequence[str] = (),
    ) -> ClaimAttempt:
        """One claim: ``tries`` gate refusals at most (0: one per lane in rotation); ``expect``:
        claim only that trajectory (reason "moved" if another comes first); ``skip`` and
        ``closed``: lanes and routes passed over (:func:`router.admission.drr.nominate`)."""
        return self._claims.claim(tries, depths=depths, expect=expect, skip=skip, closed=closed)

    def claim_many(
        self,
        count: int,
        tries: int = 0,
        *,
        depths: bool = False,
        expect: str = "",
        skip: Sequence[int] = (),
        closed: Sequence[str] = (),
    ) -> ClaimBatch:
        """Up to ``count`` claims in one script run, as many :meth:`claim` calls in a row."""
        return self._claims.claim_many(
            count, tries, depths=depths, expect=expect, skip=skip, closed=closed
        )

    def confirm(self, nomination: Nomination) -> float:
        """End a claim as admitted; returns the call's admission wait (s).

        Raises :class:`ClaimLapsed` (a :class:`StaleNomination`) if the claim is no longer
        pending: withdrawn, or reaped after its deadline (then debit again before sending).
        """
        return self._ends.confirm(nomination)

    def confirm_many(self, nominations: Sequence[Nomination]) -> list[float | None]:
        """Commit several claims in one round trip; per claim its wait, or None if it lapsed."""
        return self._ends.confirm_many(nominations)

    def confirm_on(self, pipeline: Batch, claim: Claim) -> Callable[[Any], float | None]:
        """Queue the confirmation of ``claim`` on a pipeline (a bare ``EVALSHA``, executed with
        ``raise_on_error=False``) beside other writes; pass its reply to the function returned
        for :meth:`confirm_many`'s answer (a server that lost the script: confirmed again)."""
        return self._ends.confirm_on(pipeline, claim)

    def confirm_committed(
        self, claim: Claim, mark: CommitMark, figures: AdmissionRecord
    ) -> tuple[tuple[Any, ...], Callable[[Any], tuple[bool, float | None]]]:
        """A confirmation of ``claim`` guarded by its admission's commit, to send behind that
        compare-and-set on one node, and its reply's reader (``ClaimEnds.confirm_committed``)."""
        return self._ends.confirm_committed(claim, mark, figures)

    def decline(self, nomination: Nomination) -> None:
        """End a claim as refused: the call is READY at its queue head again, its debit released."""
        self._ends.decline(nomination)

    def decline_claim(self, claim: Claim) -> None:
        """:meth:`decline` (the claim's script releases its debit)."""
        self._ends.decline(claim)

    def withdraw_claim(self, claim: Claim) -> None:
        """:meth:`withdraw` of the claim's trajectory (its claim dropped with its debit)."""
        self._queue.withdraw(claim.call.trajectory_id)

    def tenant_count(self) -> int:
        """How many tenants the configuration in force has."""
        return len(self.config.tenants)

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """As :meth:`Admitter.admit_next`: the next call ``check`` and its gate accept, confirmed.

        Each step peeks at the nomination (nothing claimed), runs ``check``, and claims that very
        call; a refused tenant is skipped where it stands and its route closed for this call.
        """
        return self._claims.admit_next(check, self.confirm)

    # --- turns in flight (docs/adr/0123-tenant-caps.md) ---------------------------------------

    def release(self, tenant: str, trajectory_id: str, claim_id: str = "") -> bool:
        """The turn ended: it leaves its tenant's turns in flight if its entry names
        ``claim_id`` ("": any claim no longer pending). Idempotent; False if nothing left."""
        return self._in_flight.end([EndedTurn(tenant, trajectory_id, claim_id)]) == 1

    def release_many(self, turns: Iterable[EndedTurn]) -> int:
        """:meth:`release` for several turns in one round trip; how many left."""
        return self._in_flight.end(turns)

    def end_turns(self, turns: Sequence[EndedTurn]) -> None:
        """The turns whose notice carries their claim end (only while their entry still names
        that claim: a duplicate message's notice carries none, and cannot end the turn that
        runs now)."""
        claimed = [turn for turn in turns if turn.claim_id]
        if claimed:
            self._in_flight.end(claimed)

    def in_flight(self, tenant: str) -> int:
        """How many of ``tenant``'s turns are in flight across the fleet now."""
        return self._in_flight.count(tenant)

    def in_flight_page(self, lane: int, cursor: int, count: int) -> InFlightPage:
        """A page of ``lane``'s turns in flight whose claim is confirmed or gone (for the drift
        sweep), and the cursor that continues the walk (0 when it is done)."""
        return self._in_flight.page(lane, cursor, count)

    def lanes(self) -> list[str]:
        """The tenant of each lane of the shared state, in lane order (retired ones too)."""
        self._state.reload()
        return [t.name for t in self._state.lanes.tenants]

    # --- reconciler ---------------------------------------------------------------------------

    def reconcile(self, ready: Readiness, limit: int = 100) -> Reconciled:
        """Resolve claims past their deadline: READY ones back to their queue head, others
        dropped; every one's gate debit released. Safe to run on several replicas at once."""
        return self._lapsed.reconcile(ready, limit)

    # --- figures ------------------------------------------------------------------------------

    def figures(self) -> FairnessFigures:
        """Per tenant: depth and credit (global); admitted calls, waits, window (this replica)."""
        return self._figures.figures()

    def admitted(self) -> list[tuple[int, int]]:
        """Per tenant, in configuration order: (calls, charge) confirmed by every replica."""
        return self._figures.admitted()
