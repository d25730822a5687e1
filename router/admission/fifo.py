"""First come, first served admission over every tenant: the peer fairness is measured against.

:class:`FifoAdmitter` keeps one queue for all tenants and admits in arrival order, with the
in-memory admitter's interface (:class:`router.admission.queue.AdmissionQueue`) and its validation
at the edge, so the dispatch loop runs unchanged over either. It is not a scheduler anyone
should deploy: a loud tenant's backlog delays everyone behind it, and tenants get shares in
proportion to what they submit, not to their weights. That is the point of comparing with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from kernel.budget import Budget
from kernel.errors import StaleNomination, SubmissionRefused
from router.admission.drr import Nomination, ReadyCall
from router.admission.fairness import FairnessBook, FairnessFigures
from router.admission.gates import ProviderGates
from router.admission.local import Admitter, Clock
from router.admission.local_claims import LocalClaiming
from router.admission.queue import FinalizeNow
from router.admission.tenants import AdmissionConfig


class FifoAdmitter(LocalClaiming):
    """One FIFO queue of READY calls across tenants; one owner, not thread-safe. ``gates``,
    ``routes`` and ``owner`` as :class:`~router.admission.local.Admitter`'s."""

    def __init__(
        self,
        config: AdmissionConfig,
        clock: Clock,
        *,
        gates: ProviderGates | None = None,
        routes: Sequence[str] = (),
        owner: str = "",
    ) -> None:
        super().__init__(gates, routes, owner)
        self.config = config
        self._clock = clock
        # Validation only: the DRR admitter's edge checks, so both refuse the same input.
        self._edge = Admitter(config, clock)
        self._lane_of = {t.name: i for i, t in enumerate(config.tenants)}
        self._queue: deque[ReadyCall] = deque()
        self._queued: set[str] = set()
        self._depth = [0] * len(config.tenants)
        self._book = FairnessBook(
            names=[t.name for t in config.tenants],
            weights=[t.weight for t in config.tenants],
            wait_buckets_s=config.wait_buckets_s,
            window_s=config.fairness_window_s,
        )

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
        """Queue a new trajectory's first call at the tail, or refuse it as the admitter does."""
        self._check_new(trajectory_id)
        call = self._edge.submit(
            tenant,
            trajectory_id,
            input_tokens=input_tokens,
            output_allowance=output_allowance,
            service_class=service_class,
            budget=budget,
            route=route,
        )
        self._edge.withdraw(trajectory_id)
        return self._append(call)

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
        """Queue a trajectory back at READY at the tail; never refused for a full queue."""
        self._check_new(trajectory_id)
        out = self._edge.requeue(
            tenant,
            trajectory_id,
            input_tokens=input_tokens,
            output_allowance=output_allowance,
            service_class=service_class,
            route=route,
        )
        if isinstance(out, FinalizeNow):
            return out
        self._edge.withdraw(trajectory_id)
        return self._append(out)

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a queued trajectory out; False if it was not queued."""
        if trajectory_id not in self._queued:
            return False
        for call in self._queue:
            if call.trajectory_id == trajectory_id:
                self._queue.remove(call)
                self._forget(call)
                return True
        return False  # pragma: no cover - the set and the queue are written together

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits."""
        return trajectory_id in self._queued

    def nominate(self) -> Nomination | None:
        """The oldest READY call of any tenant, or None."""
        if not self._queue:
            return None
        call = self._queue[0]
        return Nomination(self._lane_of[call.tenant], 0, call)

    def confirm(self, nomination: Nomination) -> float:
        """Admit the head call; returns its wait. StaleNomination if it is no longer the head."""
        if not self._queue or self._queue[0] is not nomination.call:
            raise StaleNomination(f"nomination of {nomination.call.trajectory_id} is stale")
        call = self._queue.popleft()
        self._forget(call)
        now = self._clock()
        self._book.record(nomination.lane, call.charge, now - call.ready_at, now)
        return now - call.ready_at

    def decline(self, nomination: Nomination) -> None:
        """The head stays the head (head-of-line blocking is what FIFO does)."""
        if not self._queue or self._queue[0] is not nomination.call:
            raise StaleNomination(f"nomination of {nomination.call.trajectory_id} is stale")

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """Admit the head if ``check`` passes it; otherwise nothing."""
        nomination = self.nominate()
        if nomination is None or not check(nomination.call):
            return None
        self.confirm(nomination)
        return nomination.call

    def release(self, tenant: str, trajectory_id: str, claim_id: str = "") -> bool:
        """Nothing to release: the FIFO baseline keeps no turns in flight and no caps."""
        return False

    def running(self, tenant: str, trajectory_id: str) -> None:
        """Nothing: first come, first served counts no turns in flight."""

    def in_flight(self, tenant: str) -> int:
        """Always 0: the FIFO baseline keeps no turns in flight (it ignores max_in_flight)."""
        return 0

    def depths(self) -> list[int]:
        """READY calls queued per tenant, in configuration order."""
        return list(self._depth)

    def figures(self) -> FairnessFigures:
        """Per-tenant figures, as the admitter reports them (credits are always zero)."""
        zeros = [0] * len(self._depth)
        return self._book.snapshot(self._clock(), list(self._depth), zeros)

    def _check_new(self, trajectory_id: str) -> None:
        if trajectory_id in self._queued:
            raise SubmissionRefused(
                f"trajectory {trajectory_id} is already queued", code="already_queued"
            )

    def _append(self, call: ReadyCall) -> ReadyCall:
        self._queue.append(call)
        self._queued.add(call.trajectory_id)
        self._depth[self._lane_of[call.tenant]] += 1
        return call

    def _forget(self, call: ReadyCall) -> None:
        self._queued.discard(call.trajectory_id)
        self._depth[self._lane_of[call.tenant]] -= 1
