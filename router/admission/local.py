"""The admitter in memory: tenants' READY model calls in, one admitted call at a time out.

For the embedded runner (one owner); :mod:`router.admission.redis.admitter` is the fleet's, with the
same behaviour behind the same interface (:mod:`router.admission.queue`). Calls are validated at the
edge (:meth:`Admitter.submit`, :meth:`Admitter.requeue`), so each pick runs on the plain state of
:mod:`router.admission.drr`. The clock is injected (seconds); tests and the bench pass simulated
time. Design: ``docs/adr/0001-weighted-drr-admission.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from kernel.amounts import Dimension
from kernel.budget import Budget
from kernel.errors import SubmissionRefused
from kernel.states import StopReason
from router.admission import drr
from router.admission.drr import DrrState, Nomination, ReadyCall
from router.admission.fairness import FairnessBook, FairnessFigures
from router.admission.gates import ROUTE_RE, ProviderGates
from router.admission.lanes import LaneIndex
from router.admission.local_claims import LocalClaiming
from router.admission.queue import FinalizeNow
from router.admission.tenants import AdmissionConfig, TenantConfig

Clock = Callable[[], float]


def build_state(config: AdmissionConfig) -> DrrState:
    """The empty scheduler state for a validated configuration; lanes follow its tenant order."""
    # Class quanta only order a tenant's own classes (the tenant quantum sets its share); the
    # same base quantum keeps both levels in charge tokens under one credit cap. Equal quanta
    # share one int, so thousands of tenants of a few weights read a few objects.
    shared: dict[int, int] = {}
    base = config.quantum_tokens
    quanta = [
        (
            shared.setdefault(round(base * t.weight), round(base * t.weight)),
            [shared.setdefault(round(base * w), round(base * w)) for w in t.class_weights],
        )
        for t in config.tenants
    ]
    return drr.new_state(config.credit_cap_tokens, quanta)


class Admitter(LocalClaiming):
    """Per-tenant FIFO queues of READY calls and a weighted deficit round-robin over them.

    Not thread-safe: one owner drives it (the router's admission loop). Every method that
    refuses input raises before changing anything. ``gates``, ``routes`` and ``owner``: its
    claims' gate debits (:mod:`router.admission.local_claims`).
    """

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
        self._state = build_state(config)
        self._lanes = LaneIndex(config)
        self._lane_of, self._class_of = self._lanes.lane_of, self._lanes.class_of
        # Per lane, what the hot path reads of its tenant's configuration (ADR 0191: plain
        # lists, not the configuration objects), and per slot its class's name.
        self._names = [t.name for t in config.tenants]
        self._largest = [t.largest_call_tokens for t in config.tenants]
        self._max_ready = [t.max_ready for t in config.tenants]
        self._class_names = [sys.intern(c) for t in config.tenants for c in t.class_names]
        self._where: dict[str, ReadyCall] = {}  # the queued calls by trajectory id
        # The turns in flight: their lanes by trajectory id (ids are unique across tenants);
        # per lane, how many and its cap (0: none); the lanes at their cap (ADR 0123).
        self._flying: dict[str, int] = {}
        self._in_flight = [0] * len(config.tenants)
        self._limits = [t.max_in_flight or 0 for t in config.tenants]
        self._full: set[int] = set()
        self._book = FairnessBook(
            names=[t.name for t in config.tenants],
            weights=[t.weight for t in config.tenants],
            wait_buckets_s=config.wait_buckets_s,
            window_s=config.fairness_window_s,
        )

    @property
    def state(self) -> DrrState:
        """The scheduler state, for mirroring and inspection; callers must not mutate it."""
        return self._state

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
        """Queue a newly submitted trajectory's first model call, or refuse it changing nothing.

        Raises :class:`UnknownTenant` for a tenant not configured and :class:`SubmissionRefused`
        for an unknown class, a duplicate trajectory, a call larger than the tenant's largest
        call, a full queue (``max_ready``), a budget above the tenant's maxima, or a ``route``
        (the ``provider/model`` gate the call goes through) that is not a plain name.
        """
        lane, klass = self._resolve(tenant, trajectory_id, service_class)
        charge = scheduling_charge(trajectory_id, input_tokens, output_allowance)
        route = check_route(trajectory_id, route)
        if charge > self._largest[lane]:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: its call of {charge:,} tokens "
                f"({input_tokens:,} input + {output_allowance:,} output allowance) exceeds "
                f"tenant {tenant!r}'s largest call of {self._largest[lane]:,}",
                code="call_too_large",
            )
        depth = self._state.queued[lane]
        if depth >= self._max_ready[lane]:
            raise SubmissionRefused(
                f"tenant {tenant!r} already has {depth:,} READY trajectories queued "
                f"(max_ready {self._max_ready[lane]:,}); retry later",
                code="backlog_full",
            )
        if budget is not None:
            check_budget(self._lanes.tenants[lane], trajectory_id, budget)
        return self._enqueue(
            lane, klass, trajectory_id, input_tokens, output_allowance, charge, route
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
        """Queue a running trajectory that returned to READY, or tell the caller to finalize it.

        A running trajectory is never refused for a full queue (refusing would strand admitted
        work; ``max_ready`` bounds new submissions). If its next call is larger than the tenant's
        largest call it can never be admitted, so it is not queued and the answer is
        :class:`FinalizeNow` with ``max_tokens``. Unknown tenant, class or a trajectory already
        queued still raise.
        """
        lane, klass = self._resolve(tenant, trajectory_id, service_class)
        charge = scheduling_charge(trajectory_id, input_tokens, output_allowance)
        route = check_route(trajectory_id, route)
        if charge > self._largest[lane]:
            return FinalizeNow(
                trajectory_id,
                StopReason.MAX_TOKENS,
                f"next call of {charge:,} tokens exceeds tenant {tenant!r}'s largest call "
                f"of {self._largest[lane]:,}",
            )
        return self._enqueue(
            lane, klass, trajectory_id, input_tokens, output_allowance, charge, route
        )

    def withdraw(self, trajectory_id: str) -> bool:
        """Take a queued trajectory out (paused, canceled or ended while READY); False if absent."""
        call = self._where.pop(trajectory_id, None)
        if call is None:
            return False
        lane = self._lane_of[call.tenant]
        klass = self._class_of[lane][call.service_class]
        removed = drr.remove(self._state, lane, klass, call)
        assert removed, "index and queues disagree"  # both are written only here and in confirm
        return True

    def is_queued(self, trajectory_id: str) -> bool:
        """True while the trajectory waits in a queue."""
        return trajectory_id in self._where

    # --- hot path -----------------------------------------------------------------------------

    def nominate(self) -> Nomination | None:
        """The next call by weighted deficit round-robin, or None if nothing can be admitted.

        A tenant with as many turns in flight as its ``max_in_flight`` is passed over where it
        stands (:func:`router.admission.drr.nominate`'s ``skip``: its place and credit kept, no
        quantum earned while it waits), so it blocks no other tenant.
        """
        if self._full:
            return drr.nominate(self._state, set(self._full))
        return drr.nominate(self._state)

    def confirm(self, nomination: Nomination) -> float:
        """Admit a nominated call: deduct its charge, dequeue it; returns its admission wait (s).

        Raises :class:`~kernel.errors.StaleNomination`, changing nothing, if the nomination no
        longer holds (its call was withdrawn, or credit moved under it).
        """
        drr.confirm(self._state, nomination)
        call = nomination.call
        del self._where[call.trajectory_id]
        self._fly(nomination.lane, call.trajectory_id)
        now = self._clock()
        wait = now - call.ready_at
        self._book.record(nomination.lane, call.charge, wait, now)
        return wait

    def decline(self, nomination: Nomination) -> None:
        """Refuse a nomination: no credit moves, the call stays READY at the head of its queue."""
        drr.decline(self._state, nomination)
        state, index = self._state, nomination.lane
        if (
            self._full
            and state.listed[index] == drr.NEW
            and state.queued[index] == 1
            and state.new[0] != index
        ):
            # Nominated past a capped lane ahead of it in the new list, with its last call: the
            # shared admitter's claim emptied it, which moved it to the tail of old, and its
            # decline leaves it there. Do the same, so both twins go on alike (ADR 0123).
            state.new.remove(index)
            state.old.append(index)
            state.listed[index] = drr.OLD

    def admit_next(self, check: Callable[[ReadyCall], bool]) -> ReadyCall | None:
        """Nominate, run ``check`` on the call, and confirm it; the admitted call or None.

        A tenant whose call ``check`` refuses keeps its place, its credit and its call at the head
        of its queue, and the next tenant in rotation is tried past it
        (:func:`router.admission.drr.nominate`'s ``skip``). Once a call with a route is refused,
        that route counts as closed for the rest of this call: tenants behind on the same route are
        passed over too, so a smaller call never overtakes a larger one on a gate that refused it
        (no starvation of large calls, the route's rotation unchanged), while tenants on other
        routes go on. Each backlogged tenant is tried at most once per call, so a closed gate cannot
        spin.
        """
        state = self._state
        refused: set[int] = set(self._full)  # tenants at their cap: passed over as refused
        closed: set[str] = set()
        for _ in range(len(state.new) + len(state.old)):
            nomination = drr.nominate(state, refused, closed)
            if nomination is None:
                return None
            call = nomination.call
            if check(call):
                self.confirm(nomination)
                return call
            refused.add(nomination.lane)
            if call.route:
                closed.add(call.route)
        return None

    # --- turns in flight ------------------------------------------------------------------------

    def release(self, tenant: str, trajectory_id: str, claim_id: str = "") -> bool:
        """The turn of ``trajectory_id`` (admitted by :meth:`confirm`) ended: it no longer counts
        against its tenant's ``max_in_flight``. Idempotent: False if it was not in flight.
        ``claim_id`` is the shared admitter's guard; in memory one owner admits and ends turns
        in order, so it is not needed."""
        lane = self._flying.get(trajectory_id)
        if lane is None:
            return False
        name = self._names[lane]
        if name is not tenant and name != tenant:
            return False
        del self._flying[trajectory_id]
        count = self._in_flight[lane] - 1
        self._in_flight[lane] = count
        if count < self._limits[lane]:
            self._full.discard(lane)
        return True

    def running(self, tenant: str, trajectory_id: str) -> None:
        """Count a turn admitted before this admitter was built (read from the store when a
        router takes the admitter over) as in flight, until :meth:`release`."""
        lane = self._lane_of.get(tenant)
        if lane is not None:
            self._fly(lane, trajectory_id)

    def _fly(self, lane: int, trajectory_id: str) -> None:
        flying = self._flying
        before = len(flying)
        flying.setdefault(trajectory_id, lane)
        if len(flying) == before:  # already in flight
            return
        count = self._in_flight[lane] + 1
        self._in_flight[lane] = count
        if self._limits[lane] and count >= self._limits[lane]:
            self._full.add(lane)

    def in_flight(self, tenant: str) -> int:
        """How many of ``tenant``'s admitted turns have not ended (0 for an unknown tenant)."""
        lane = self._lane_of.get(tenant)
        return 0 if lane is None else self._in_flight[lane]

    # --- figures ------------------------------------------------------------------------------

    def figures(self) -> FairnessFigures:
        """Per tenant: admitted charge and calls, depth, wait histogram, credit; Jain's index."""
        state = self._state
        return self._book.snapshot(self._clock(), state.queued, state.credit)

    def depths(self) -> list[int]:
        """Per lane (the configuration's tenant order): how many calls it has queued."""
        return list(self._state.queued)

    # --- internals ----------------------------------------------------------------------------

    def _resolve(
        self, tenant: str, trajectory_id: str, service_class: str | None
    ) -> tuple[int, int]:
        lane = self._lane_of.get(tenant)
        if lane is None or service_class is not None:  # the refusals, and a class by name
            lane, klass, _ = self._lanes.resolve(tenant, service_class)
        else:
            klass = self._lanes.first_class[lane]
        if trajectory_id in self._where:
            raise SubmissionRefused(
                f"trajectory {trajectory_id} is already queued", code="already_queued"
            )
        return lane, klass

    def _enqueue(
        self,
        lane: int,
        klass: int,
        trajectory_id: str,
        input_tokens: int,
        output_allowance: int,
        charge: int,
        route: str = "",
    ) -> ReadyCall:
        state = self._state
        call = ReadyCall(
            trajectory_id,
            self._names[lane],
            self._class_names[state.first[lane] + klass],
            input_tokens,
            output_allowance,
            charge,
            self._clock(),
            route,
        )
        drr.enqueue(state, lane, klass, call)
        self._where[trajectory_id] = call
        return call


def scheduling_charge(trajectory_id: str, input_tokens: int, output_allowance: int) -> int:
    """The scheduling charge: full input plus output allowance (cached input counts in full)."""
    # bool is an int subclass; a True token count is a caller bug, not one token
    if (
        type(input_tokens) is not int
        or type(output_allowance) is not int
        or input_tokens < 0
        or output_allowance < 1
    ):
        raise SubmissionRefused(
            f"trajectory {trajectory_id}: input_tokens must be an integer >= 0 and "
            f"output_allowance an integer >= 1; got {input_tokens!r} and {output_allowance!r}",
            code="invalid_call",
        )
    return input_tokens + output_allowance


def check_route(trajectory_id: str, route: str | None) -> str:
    """The call's gate route (``provider/model``), "" for none; refuse a name unfit for a key."""
    if route is None or route == "":
        return ""
    if not isinstance(route, str) or not ROUTE_RE.match(route):
        raise SubmissionRefused(
            f"trajectory {trajectory_id}: route {route!r} must match {ROUTE_RE.pattern} "
            "(provider/model, e.g. 'openai/gpt-4o-mini')",
            code="invalid_route",
        )
    return route


def check_budget(cfg: TenantConfig, trajectory_id: str, budget: Budget) -> None:
    maxima = cfg.budget_max
    for dim in Dimension:
        ceiling = getattr(maxima, dim.value)
        if ceiling is not None and budget.allowance(dim) > ceiling:
            raise SubmissionRefused(
                f"trajectory {trajectory_id}: budget {dim.value} {budget.allowance(dim)} exceeds "
                f"tenant {cfg.name!r}'s maximum of {ceiling}",
                code="budget_over_maximum",
                field="budget",
            )
