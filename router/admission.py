"""The admission interface: what the router's dispatch loop (and the embedded runner) program to.

Two implementations with one behaviour, held to it by ``tests/contract/test_admitter_contract.py``:
:class:`router.admitter.Admitter` (in memory; one owner; the embedded runner) and
:class:`router.redis_admitter.RedisAdmitter` (state in Redis; any number of router replicas).

The loop, for either::

    nomination = admitter.nominate()           # next call by weighted DRR, or None
    if nomination is None:
        wait for a submission, a settlement or a short interval; loop
    outcome = kernel admission (Admit event) + compare-and-set of the record
    if outcome committed:
        admitter.commit(nomination)            # ClaimLapsed (Redis): debit again before sending
        send, with nomination.claim_id as the gate lease (Redis), renewing it while it runs
    elif the record is no longer READY (paused, canceled, finalizing):
        admitter.withdraw(nomination.call.trajectory_id)
    else:
        admitter.decline(nomination)           # the call stays READY at its queue head

Contract, for both:

* ``submit`` / ``requeue`` validate at the edge and either queue the call or raise
  (:class:`~kernel.errors.InvalidInput`) changing nothing; ``requeue`` of a call too large for
  its tenant answers :class:`~router.admitter.FinalizeNow` instead.
* ``nominate`` proposes the head call of the lane DRR picks; every nomination is resolved
  exactly once by ``commit``, ``decline`` or a ``withdraw`` of its trajectory. A resolution of
  a nomination that no longer holds raises :class:`~kernel.errors.StaleNomination` and changes
  nothing. When each nomination is resolved before the next, both implementations admit the
  same calls in the same order and hold the same credits and depths.
* ``decline`` changes no credit and leaves the call at the head of its queue; its lane goes to
  the tail of the rotation, so one trajectory's refusal never stalls the other tenants.
* ``admit_next(check)``: a tenant whose call ``check`` (or, in Redis, its gate) refuses keeps
  its place, credit and call, and its route counts as closed for the rest of that call, so a
  gate shared by every tenant that is full leaves the rotation, and so the weighted shares,
  exactly as they were; tenants on other routes go on.
* Exclusivity: in memory there is one owner, so a nomination is trivially its own; the Redis
  admitter *claims* (the call leaves its queue and its gate is debited in the same script),
  so no two live nominations, in any replicas, name the same call. An unresolved Redis claim
  is reaped by ``RedisAdmitter.reconcile`` after its deadline.
* Provider gates: the Redis admitter debits the call's route in the claim itself (a refused
  call stays READY); in memory, pass ``MemoryGates.check`` to ``admit_next``.
* Redis only, for a dispatcher with several free slots: ``claim_many``, ``commit_many`` and
  ``requeue_many`` do for several calls in one round trip what the single calls do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kernel.budget import Budget
from router.admitter import FinalizeNow
from router.drr import Nomination, ReadyCall
from router.fairness import FairnessFigures


class AdmissionQueue(Protocol):
    """Tenants' READY model calls in, one admitted call at a time out (module contract)."""

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
        """Queue a new trajectory's first call, or raise changing nothing."""
        ...

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
        """Queue a trajectory back at READY; never refused for a full queue."""
        ...

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a trajectory out (paused, canceled, ended); False if it was not there."""
        ...

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits to be admitted."""
        ...

    def nominate(self) -> Nomination | None:
        """The next call by weighted deficit round-robin, or None."""
        ...

    def commit(self, nomination: Nomination) -> float:
        """Admit the nominated call; returns its admission wait in seconds."""
        ...

    def decline(self, nomination: Nomination) -> None:
        """Refuse the nomination: no credit moves, the call stays READY at its queue head."""
        ...

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """Nominate, ``check``, commit or decline; each lane in rotation tried at most once."""
        ...

    def figures(self) -> FairnessFigures:
        """Per-tenant fairness figures."""
        ...
