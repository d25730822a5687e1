"""The admission interface that the dispatch loop and the embedded runner program to.

Two implementations, one behaviour (``tests/contract/test_admitter_contract.py``):
:class:`router.admission.local.Admitter` in memory and
:class:`router.admission.redis.admitter.RedisAdmitter`,
whose nominations are claims exclusive across router replicas.

* ``submit`` and ``requeue`` queue the call or raise :class:`~kernel.errors.InvalidInput`,
  changing nothing; ``requeue`` of a call too large for its tenant answers ``FinalizeNow``.
* Each nomination is resolved once, by ``confirm``, ``decline`` or a ``withdraw`` of its
  trajectory; resolving one that no longer holds raises :class:`~kernel.errors.StaleNomination`
  and changes nothing. Resolved one by one, both admit the same calls in the same order.
* An admitted call's turn is in flight until ``release``; a tenant with ``max_in_flight``
  turns in flight is passed over where it stands (``docs/adr/0123-tenant-caps.md``).
Design: ``docs/adr/0001-weighted-drr-admission.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kernel.budget import Budget
from kernel.states import StopReason
from router.admission.drr import Nomination, ReadyCall
from router.admission.fairness import FairnessFigures


@dataclass(frozen=True, slots=True)
class FinalizeNow:
    """A trajectory that must not wait: finalize it at once with ``stop_reason``."""

    trajectory_id: str
    stop_reason: StopReason
    why: str


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

    def confirm(self, nomination: Nomination) -> float:
        """Admit the nominated call; returns its admission wait in seconds."""
        ...

    def decline(self, nomination: Nomination) -> None:
        """Refuse the nomination: no credit moves, the call stays READY at its queue head, and
        its lane goes to the tail of the rotation so the other tenants come first."""
        ...

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """Nominate, ``check``, confirm or decline; each lane in rotation tried at most once.

        A tenant whose call is refused keeps its place, credit and call, and its route counts
        as closed for the rest of this call. Provider gates: in memory pass
        ``MemoryGates.check`` as ``check``; the Redis admitter debits the gate in its claim.
        """
        ...

    def release(self, tenant: str, trajectory_id: str, claim_id: str = "") -> bool:
        """The trajectory's turn ended: it leaves its tenant's turns in flight, so a tenant at
        its ``max_in_flight`` may be admitted again. Idempotent; False if it was not in flight
        (or, given ``claim_id``, was admitted again under another claim since)."""
        ...

    def in_flight(self, tenant: str) -> int:
        """How many of the tenant's admitted turns have not ended."""
        ...

    def figures(self) -> FairnessFigures:
        """Per-tenant fairness figures."""
        ...
