"""Weighted deficit round-robin over READY model calls: the plain state and the policy over it.

The state (:class:`DrrState`) is plain fields and the policy is functions over it, which the
Redis admitter's Lua scripts mirror; this module holds no configuration, clock or figures
(:mod:`router.admitter` validates at the edge and keeps those). :func:`nominate` only proposes;
:func:`confirm` deducts the charge and dequeues; :func:`decline` sends the lane to the tail of
the rotation and changes no credit and no queue. Credits are integers, so Lua computes the same.
Design: ``docs/adr/0001-weighted-drr-admission.md``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from kernel.errors import StaleNomination

#: ``TenantLane.listed``: out of rotation, in the new list, in the old list.
UNLISTED, NEW, OLD = 0, 1, 2


@dataclass(slots=True, eq=False)
class ReadyCall:
    """A READY trajectory's next model call, as queued: its charge is input + output allowance."""

    trajectory_id: str
    tenant: str
    service_class: str
    input_tokens: int
    output_allowance: int
    charge: int
    ready_at: float
    #: The provider gate it is admitted through (``provider/model``); "" for none.
    route: str = ""


@dataclass(slots=True, eq=False)
class ClassLane:
    """One service class of a tenant: FIFO queue of READY calls and (inner-level) credit."""

    name: str
    quantum: int
    credit: int = 0
    queue: deque[ReadyCall] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class TenantLane:
    """One tenant: credit, where it is in the rotation, its classes and their rotation."""

    name: str
    quantum: int
    classes: list[ClassLane]
    credit: int = 0
    queued: int = 0
    listed: int = UNLISTED
    class_active: deque[int] = field(default_factory=deque)


@dataclass(slots=True, eq=False)
class DrrState:
    """The whole scheduler state; the Redis admitter keeps the same fields under one hash tag.

    Invariants (the property tests check them): ``0 <= credit <= credit_cap`` for every tenant
    and class; a lane or class with an empty queue has credit 0; a lane with queued calls is in
    exactly one of ``new`` and ``old``; a lane in ``new`` has queued calls (an emptied lane may
    linger in ``old`` as a placeholder); a class is in its tenant's ``class_active`` exactly
    when its queue is non-empty.
    """

    credit_cap: int
    lanes: list[TenantLane]
    new: deque[int] = field(default_factory=deque)
    old: deque[int] = field(default_factory=deque)
    rounds: int = 0
    round_left: int = 0


@dataclass(slots=True, eq=False)
class Nomination:
    """A proposal: admit ``call`` of lane ``lane``, class ``klass``; nothing is deducted yet."""

    lane: int
    klass: int
    call: ReadyCall


def nominate(
    state: DrrState, skip: set[int] | None = None, closed: Collection[str] = ()
) -> Nomination | None:
    """Propose the next call to admit, or None if nothing is queued or nothing can ever fit.

    Changes only rotation and credit grants, never a queue; two calls with no confirm, decline
    or submission between them return the same call. None with calls still queued means every
    backlogged lane sits at the credit cap with a head call larger than the cap, which a
    validated configuration rules out.

    ``skip``: lanes passed over where they stand (their place, credit and visit kept);
    ``closed``: routes whose gate refused a call: a lane whose next call goes through one is
    added to ``skip`` when the scan reaches it, before its visit can end or earn credit.
    """
    if skip is not None and (skip or closed):
        return _nominate_passing_over(state, skip, closed)
    # The same loop as _nominate_passing_over's with nothing passed over, written out: it is
    # the admission hot path, and a call per visit costs more than the rest of the visit.
    new, old = state.new, state.old
    lanes = state.lanes
    cap = state.credit_cap
    idle = 0  # visits in a row that earned no credit; a full cycle of them is a stall
    while True:
        if new:
            rotation = new
        elif old:
            rotation = old
        else:
            return None
        index = rotation[0]
        lane = lanes[index]
        if lane.queued:
            klass = 0 if len(lane.classes) == 1 else _class_head(lane, cap)
            if klass >= 0:
                call = lane.classes[klass].queue[0]
                if call.charge <= lane.credit:
                    return Nomination(index, klass, call)
            # The visit is over: earn the next visit's quantum and go to the tail of old.
            before = lane.credit
            grant = before + lane.quantum
            lane.credit = grant if grant < cap else cap
            idle = 0 if lane.credit != before else idle + 1
            rotation.popleft()
            old.append(index)
            lane.listed = OLD
        else:  # an emptied lane's placeholder reaches the head: it leaves the rotation
            rotation.popleft()
            lane.listed = UNLISTED
        # count the visit (inlined _count_visit)
        state.round_left -= 1
        if state.round_left <= 0:
            state.rounds += 1
            state.round_left = len(new) + len(old)
        if idle > len(new) + len(old):
            return None


def _nominate_passing_over(
    state: DrrState, skip: set[int], closed: Collection[str]
) -> Nomination | None:
    """:func:`nominate` with ``skip`` and ``closed``: each visit as there, at the first lane
    not skipped, which need not be the head of its list."""
    cap = state.credit_cap
    idle = 0
    while True:
        index, rotation = _first_unskipped(state, skip)
        if index < 0:
            return None
        lane = state.lanes[index]
        if lane.queued:
            if closed and _head_route(lane) in closed:
                skip.add(index)
                continue
            nomination = _offer(lane, index, cap)
            if nomination is not None:
                return nomination
            idle = 0 if _end_visit(lane, cap) else idle + 1
            _leave(rotation, index)
            state.old.append(index)
            lane.listed = OLD
        else:
            _leave(rotation, index)
            lane.listed = UNLISTED
        _count_visit(state)
        if idle > len(state.new) + len(state.old):
            return None


def _offer(lane: TenantLane, index: int, cap: int) -> Nomination | None:
    """The lane's next call if its credit covers it, else None (its visit is over)."""
    klass = 0 if len(lane.classes) == 1 else _class_head(lane, cap)
    if klass >= 0:
        call = lane.classes[klass].queue[0]
        if call.charge <= lane.credit:
            return Nomination(index, klass, call)
    return None


def _end_visit(lane: TenantLane, cap: int) -> bool:
    """Credit the lane's quantum for its next visit, up to ``cap``; False if it earned nothing."""
    before = lane.credit
    grant = before + lane.quantum
    lane.credit = grant if grant < cap else cap
    return lane.credit != before


def _head_route(lane: TenantLane) -> str:
    """The route of the call the lane offers next (its first active class's head)."""
    klass = 0 if len(lane.classes) == 1 else lane.class_active[0]
    return lane.classes[klass].queue[0].route


def _first_unskipped(state: DrrState, skip: Collection[int]) -> tuple[int, deque[int]]:
    """The first lane of new, then of old, that is not skipped; -1 if there is none."""
    for rotation in (state.new, state.old):
        for index in rotation:
            if index not in skip:
                return index, rotation
    return -1, state.old


def _leave(rotation: deque[int], index: int) -> None:
    if rotation[0] == index:
        rotation.popleft()
    else:
        rotation.remove(index)


def confirm(state: DrrState, nomination: Nomination) -> None:
    """Admit the nominated call: dequeue it and deduct its charge from tenant (and class) credit.

    Raises :class:`StaleNomination`, changing nothing, if the call is no longer at the head of
    its queue or its charge no longer fits.
    """
    lane = state.lanes[nomination.lane]
    cls = lane.classes[nomination.klass]
    call = nomination.call
    queue = cls.queue
    charge = call.charge
    multi = len(lane.classes) > 1
    if not queue or queue[0] is not call or lane.credit < charge or (multi and cls.credit < charge):
        raise StaleNomination(f"nomination of {call.trajectory_id} is stale; nominate again")
    queue.popleft()
    lane.credit -= charge
    lane.queued -= 1
    if multi:
        cls.credit -= charge
        if not queue:
            _class_emptied(lane, nomination.klass)
    if not lane.queued:
        _lane_emptied(state, nomination.lane)


def decline(state: DrrState, nomination: Nomination) -> None:
    """Refuse the nomination: no credit changes, the call stays at the head of its queue.

    The lane goes to the tail of the old list, so the next :func:`nominate` looks at the other
    lanes first; with its credit unchanged it is nominated again on its next visit.
    Raises :class:`StaleNomination` if the call is no longer at the head of its queue.
    """
    index = nomination.lane
    lane = state.lanes[index]
    queue = lane.classes[nomination.klass].queue
    if not queue or queue[0] is not nomination.call:
        raise StaleNomination(
            f"nomination of {nomination.call.trajectory_id} is stale; nothing to decline"
        )
    rotation = state.new if lane.listed == NEW else state.old
    if rotation and rotation[0] == index:
        rotation.popleft()
        state.old.append(index)
        lane.listed = OLD
        _count_visit(state)


def enqueue(state: DrrState, lane_index: int, klass: int, call: ReadyCall) -> None:
    """Append a READY call at the tail of its class queue; an idle lane enters the new list.

    The caller has validated the call (tenant, class, size); this cannot fail.
    """
    lane = state.lanes[lane_index]
    cls = lane.classes[klass]
    if not cls.queue and len(lane.classes) > 1:
        cls.credit = min(cls.quantum, state.credit_cap)
        lane.class_active.append(klass)
    cls.queue.append(call)
    lane.queued += 1
    if lane.queued > 1:
        return
    # Empty before: its credit was reset to zero, so it gets the quantum for its coming visit,
    # in the new list if it was out of rotation, or where its placeholder stands in old.
    lane.credit = min(lane.quantum, state.credit_cap)
    if lane.listed == UNLISTED:
        lane.listed = NEW
        state.new.append(lane_index)
        if state.round_left <= 0:
            state.round_left = len(state.new) + len(state.old)


def remove(state: DrrState, lane_index: int, klass: int, call: ReadyCall) -> bool:
    """Take a call out of its queue wherever it stands (a READY trajectory paused or canceled).

    Returns False if it is not queued. An emptied class or lane has its credit reset to zero.
    """
    lane = state.lanes[lane_index]
    cls = lane.classes[klass]
    try:
        cls.queue.remove(call)
    except ValueError:
        return False
    lane.queued -= 1
    if not cls.queue and len(lane.classes) > 1:
        _class_emptied(lane, klass)
    if not lane.queued:
        _lane_emptied(state, lane_index)
    return True


# --- rotation bookkeeping ---------------------------------------------------------------------


def _count_visit(state: DrrState) -> None:
    state.round_left -= 1
    if state.round_left <= 0:
        state.rounds += 1
        state.round_left = len(state.new) + len(state.old)


def _lane_emptied(state: DrrState, index: int) -> None:
    """Reset an emptied lane's credit; a new lane becomes a placeholder at the tail of old."""
    lane = state.lanes[index]
    lane.credit = 0
    if lane.listed == NEW:
        new = state.new
        at_head = new[0] == index
        new.remove(index)
        state.old.append(index)
        lane.listed = OLD
        if at_head:
            _count_visit(state)
    elif state.old and state.old[0] == index:
        # An old lane that empties during its own visit leaves at once, as in FQ-CoDel;
        # elsewhere in old it stays a placeholder until its turn.
        state.old.popleft()
        lane.listed = UNLISTED
        _count_visit(state)


def _class_emptied(lane: TenantLane, klass: int) -> None:
    lane.classes[klass].credit = 0
    active = lane.class_active
    if active[0] == klass:
        active.popleft()
    else:
        active.remove(klass)


def _class_head(lane: TenantLane, cap: int) -> int:
    """Index of the class whose head call the tenant offers next, or -1 if none can ever fit.

    The inner rotation advances here and persists, so the tenant keeps offering the same call
    until it is admitted or withdrawn, and gathers tenant credit for that one call.
    """
    active = lane.class_active
    classes = lane.classes
    idle = 0
    while True:
        cls = classes[active[0]]
        if cls.queue[0].charge <= cls.credit:
            return active[0]
        before = cls.credit
        grant = before + cls.quantum
        cls.credit = grant if grant < cap else cap
        idle = 0 if cls.credit != before else idle + 1
        active.rotate(-1)
        if idle > len(active):
            return -1
