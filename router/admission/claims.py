"""Claims: the nominations an admitter hands the dispatch loop, and what the loop asks of it.

A :class:`Claim` is a nomination (:class:`router.admission.drr.Nomination`) its holder admits,
declines or withdraws exactly once; its gate debit, if its call has a route, is already taken,
as a gate lease named by the claim id. The shared admitter
(:class:`router.admission.redis.admitter.RedisAdmitter`) claims in Redis, exclusively across
router replicas; an in-process admitter (:mod:`router.admission.local_claims`) claims for its one
owner. Both are :class:`Claiming`, the one interface of :class:`router.process.dispatch.Dispatcher`.
Design: ``docs/adr/0003-redis-admitter-claims.md``, ``docs/adr/0005-dispatch-loop.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from router.admission.drr import Nomination, ReadyCall
from router.admission.gates import GateReading
from router.admission.queue import AdmissionQueue, FinalizeNow


@dataclass(slots=True, eq=False)
class Claim(Nomination):
    """A claimed nomination: the call is out of its queue and its gate debited, until resolved."""

    claim_id: str = ""  # also the id of the gate lease its debit took ("" for no gate)
    seq: int = 0  # order of claims across every replica (the shared admitter's)
    gate: GateReading | None = None  # the route's counters right after this debit
    depths: tuple[int, ...] = ()  # every lane's queue depth after the claim, when asked
    backlogged: bool = False  # every configured tenant had a call READY when it was claimed


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """Claims made for the dispatch loop, in order, and the refusals (how many, and the reason
    and route of the last). ``more``: the admitter may have more to claim at once (an
    in-process admitter claims one call a time)."""

    claims: tuple[Claim, ...]
    refused: int
    reason: str
    refused_route: str = ""
    more: bool = False


class ReturningCall(NamedTuple):
    """A READY trajectory queued back with its next call (a turn ended READY)."""

    tenant: str
    trajectory_id: str
    input_tokens: int
    output_allowance: int
    service_class: str | None  # None: the tenant's first class
    route: str | None  # the gate route; None when no gate governs the call


class EndedTurn(NamedTuple):
    """A turn whose notice came in: it leaves its tenant's turns in flight."""

    tenant: str
    trajectory_id: str
    claim_id: str  # the claim it was admitted under, as its notice gives it back ("" for none)
    call_id: str = ""  # the model call it carried ("" for none)


class AdmissionRecord(NamedTuple):
    """Where a script records one admission for the fairness figures: the list, the entry as
    stored there, and the most entries the list keeps."""

    list_key: str
    entry: str
    cap: int


#: What a requeue answers per call: queued, to be finalized at once, or refused.
Requeued = ReadyCall | FinalizeNow | Exception


class Claiming(AdmissionQueue, Protocol):
    """What the dispatch loop asks of an admitter, beside the queue (module docstring)."""

    #: Workers may admit follow-on turns through it: it is the one every process shares.
    admits_follow_ons: bool

    def tenant_count(self) -> int:
        """How many tenants are configured now."""
        ...

    def claim_many(self, count: int, tries: int = 0, *, depths: bool = False) -> ClaimBatch:
        """Up to ``count`` claims, each with its gate debited; ``depths``: mark each claim
        ``backlogged`` (reads every tenant's queue depth)."""
        ...

    def confirm_many(self, nominations: Sequence[Nomination]) -> list[float | None]:
        """Admit each claim; per claim its admission wait, or None if it lapsed meanwhile and
        lost its debit (debit again before the request may leave)."""
        ...

    def decline_claim(self, claim: Claim) -> None:
        """Refuse a claim: the call is READY at its queue head again, its debit released."""
        ...

    def withdraw_claim(self, claim: Claim) -> None:
        """Take a claimed call's trajectory out (it is no longer READY), its debit released."""
        ...

    def requeue_many(self, calls: Sequence[ReturningCall]) -> Sequence[Requeued]:
        """Queue each trajectory back; per call its answer. May raise
        :class:`~kernel.errors.InvalidInput` for the whole batch (then requeue one by one)."""
        ...

    def end_turns(self, turns: Sequence[EndedTurn]) -> None:
        """The turns ended: they leave their tenants' turns in flight (idempotent)."""
        ...
