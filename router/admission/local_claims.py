"""Claims of an admitter in one process: one nomination at a time, its gate debited here.

The shared admitter debits a call's gate in the script that claims it; an admitter in one
process (:class:`~router.admission.local.Admitter`, :class:`~router.admission.fifo.FifoAdmitter`)
does the same here, on the gates it was given, before the nomination leaves as a
:class:`~router.admission.claims.Claim` (lease id ``<trajectory>#<owner>#<serial>``). Its one
owner admits in order, so a claim is only the nomination and its debit: nothing else holds it.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence

from kernel.errors import InvalidInput, StaleNomination
from router.admission.claims import Claim, ClaimBatch, EndedTurn, Requeued, ReturningCall
from router.admission.drr import Nomination, ReadyCall
from router.admission.gates import Clock, GateReading, ProviderGates
from router.admission.queue import FinalizeNow
from router.admission.tenants import AdmissionConfig

log = logging.getLogger("reins.router.admission")
_NO_CLAIM = ClaimBatch((), 0, "")


def has_room(reading: GateReading, now: float) -> bool:
    """True when one more request fits the gate's counters as read (a hint; the debit decides)."""
    if reading.paused_until > now:
        return False
    if 0 <= reading.concurrency <= reading.leases:
        return False
    return not 0 <= reading.rpm <= reading.requests


class LocalClaiming(abc.ABC):
    """The :class:`~router.admission.claims.Claiming` operations over an admitter's own queue
    operations (module docstring). ``gates``: where a call's route is debited (None: no gate),
    ``routes`` the routes they govern; ``owner`` names the claims' leases."""

    admits_follow_ons = False
    config: AdmissionConfig
    _clock: Clock

    def __init__(
        self, gates: ProviderGates | None = None, routes: Sequence[str] = (), owner: str = ""
    ) -> None:
        self._gates, self._routes, self._owner, self._serial = gates, tuple(routes), owner, 0

    # --- what an admitter in one process provides ----------------------------------------------

    @abc.abstractmethod
    def nominate(self) -> Nomination | None: ...

    @abc.abstractmethod
    def confirm(self, nomination: Nomination) -> float: ...

    @abc.abstractmethod
    def decline(self, nomination: Nomination) -> None: ...

    @abc.abstractmethod
    def withdraw(self, trajectory_id: str) -> bool: ...

    @abc.abstractmethod
    def requeue(
        self,
        tenant: str,
        trajectory_id: str,
        *,
        input_tokens: int,
        output_allowance: int,
        service_class: str | None = None,
        route: str | None = None,
    ) -> ReadyCall | FinalizeNow: ...

    @abc.abstractmethod
    def release(self, tenant: str, trajectory_id: str, claim_id: str = "") -> bool: ...

    @abc.abstractmethod
    def depths(self) -> list[int]: ...

    @abc.abstractmethod
    def running(self, tenant: str, trajectory_id: str) -> None:
        """Count a turn admitted before this admitter was built as in flight (read from the
        store when a router takes the admitter over)."""

    # --- claims ----------------------------------------------------------------------------------

    def tenant_count(self) -> int:
        """How many tenants are configured."""
        return len(self.config.tenants)

    def claim_many(self, count: int, tries: int = 0, *, depths: bool = False) -> ClaimBatch:
        """The next nomination as a claim, its gate debited (at most one: the next is known only
        once this one is resolved); none when no gate has room or nothing is queued."""
        if count < 1 or not self._room():
            return _NO_CLAIM
        nomination = self.nominate()
        if nomination is None:
            return _NO_CLAIM
        call = nomination.call
        backlogged = depths and all(d > 0 for d in self.depths())
        lease = ""
        if call.route and self._gates is not None:
            self._serial += 1
            lease = f"{call.trajectory_id}#{self._owner}#{self._serial}"
            debit = self._gates.debit(call.route, lease, call.charge)
            if not debit.ok:
                self.decline(nomination)
                return ClaimBatch((), 1, debit.reason, call.route)
        claim = Claim(
            nomination.lane, nomination.klass, call, claim_id=lease, backlogged=backlogged
        )
        return ClaimBatch((claim,), 0, "", more=True)

    def confirm_many(self, nominations: Sequence[Nomination]) -> list[float | None]:
        """Admit each claim; its wait (0 for one already resolved: nothing lapses here)."""
        waits: list[float | None] = []
        for nomination in nominations:
            try:
                waits.append(self.confirm(nomination))
            except StaleNomination as exc:
                log.warning("nomination of %s already resolved: %s", nomination.call, exc)
                waits.append(0.0)
        return waits

    def decline_claim(self, claim: Claim) -> None:
        """Release the claim's debit; the call stays READY at its queue head."""
        self._release(claim)
        self.decline(claim)

    def withdraw_claim(self, claim: Claim) -> None:
        """Release the claim's debit and take its trajectory out."""
        self._release(claim)
        self.withdraw(claim.call.trajectory_id)

    def requeue_many(self, calls: Sequence[ReturningCall]) -> list[Requeued]:
        """Queue each trajectory back; a refused one is answered with its error."""
        answers: list[Requeued] = []
        for tenant, tid, tokens, allowance, klass, route in calls:
            try:
                answers.append(
                    self.requeue(
                        tenant,
                        tid,
                        input_tokens=tokens,
                        output_allowance=allowance,
                        service_class=klass,
                        route=route,
                    )
                )
            except InvalidInput as exc:
                answers.append(exc)
        return answers

    def end_turns(self, turns: Sequence[EndedTurn]) -> None:
        """Every turn that carried a call leaves its tenant's turns in flight (one owner admits
        and ends turns in order, so no claim guards it)."""
        for turn in turns:
            if turn.call_id:
                self.release(turn.tenant, turn.trajectory_id)

    def _room(self) -> bool:
        """True when some route (or no gate at all) could take one more request."""
        gates = self._gates
        if gates is None or not self._routes:
            return True
        now = self._clock()
        return any(has_room(gates.reading(r), now) for r in self._routes)

    def _release(self, claim: Claim) -> None:
        route = claim.call.route
        if claim.claim_id and route and self._gates is not None:
            self._gates.release(route, claim.claim_id)
