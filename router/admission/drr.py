"""Weighted deficit round-robin over READY model calls: the plain state and the policy over it.

The state (:class:`DrrState`) is plain fields and the policy is functions over it, which the Redis
admitter's Lua scripts mirror; this module holds no configuration, clock or figures
(:mod:`router.admission.local` validates at the edge and keeps those). :func:`nominate` only
proposes; :func:`confirm` deducts the charge and dequeues; :func:`decline` sends the lane to the
tail of the rotation and changes no credit and no queue. Credits are integers, so Lua computes the
same. Design: ``docs/adr/0001-weighted-drr-admission.md``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from kernel.errors import StaleNomination

#: ``DrrState.listed``: out of rotation, in the new list, in the old list.
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
    #: The call queued behind it in its class queue while it is queued (the queue's link).
    behind: ReadyCall | None = field(default=None, init=False, repr=False)


@dataclass(slots=True, eq=False)
class DrrState:
    """The whole scheduler state; the Redis admitter keeps the same fields under one hash tag.

    Kept as flat lists indexed by lane (and by *slot*, a lane's class numbers from
    ``first[lane]`` on), not an object per tenant: each admission then touches a few list
    entries that the rotation visits nearly in lane order, not a handful of objects per tenant
    scattered through memory (ADR 0191). A class queue is a chain of calls, ``head`` to
    ``tail`` by :attr:`ReadyCall.behind`. :attr:`lanes` reads it lane by lane.

    Invariants (the property tests check them): ``0 <= credit <= credit_cap`` for every tenant
    and class; a lane or class with an empty queue has credit 0; a lane with queued calls is in
    exactly one of ``new`` and ``old``; a lane in ``new`` has queued calls (an emptied lane may
    linger in ``old`` as a placeholder); a class is in its tenant's ``class_active`` exactly
    when its queue is non-empty.
    """

    credit_cap: int
    #: Per lane: its quantum, its credit, its calls queued, where it is in the rotation.
    quantum: list[int]
    credit: list[int]
    queued: list[int]
    listed: list[int]
    #: Per lane: the slot of its class 0; its classes' rotation, None for a one-class lane.
    first: list[int]
    class_active: list[deque[int] | None]
    #: Per slot: the class's quantum, its credit, the first and last call of its queue.
    class_quantum: list[int]
    class_credit: list[int]
    head: list[ReadyCall | None]
    tail: list[ReadyCall | None]
    new: deque[int] = field(default_factory=deque)
    old: deque[int] = field(default_factory=deque)
    rounds: int = 0
    round_left: int = 0

    @property
    def lanes(self) -> list[LaneView]:
        """Each lane as an object, for inspection (live: it reads the state as it is then)."""
        return [LaneView(self, i) for i in range(len(self.quantum))]


def new_state(credit_cap: int, quanta: Sequence[tuple[int, Sequence[int]]]) -> DrrState:
    """The empty state for lanes of ``quanta``: per lane, its quantum and its classes' quanta."""
    first: list[int] = []
    class_quantum: list[int] = []
    for _, classes in quanta:
        first.append(len(class_quantum))
        class_quantum.extend(classes)
    slots = len(class_quantum)
    lanes = len(quanta)
    return DrrState(
        credit_cap=credit_cap,
        quantum=[q for q, _ in quanta],
        credit=[0] * lanes,
        queued=[0] * lanes,
        listed=[UNLISTED] * lanes,
        first=first,
        class_active=[deque() if len(classes) > 1 else None for _, classes in quanta],
        class_quantum=class_quantum,
        class_credit=[0] * slots,
        head=[None] * slots,
        tail=[None] * slots,
    )


class _Column:
    """A view's attribute: entry ``view._at`` of the state's list of the same name (or of
    ``field``), read when asked."""

    __slots__ = ("field",)

    def __init__(self, field: str = "") -> None:
        self.field = field

    def __set_name__(self, owner: type, name: str) -> None:
        self.field = self.field or name

    def __get__(self, view: LaneView | ClassView, owner: type | None = None) -> int:
        column: list[int] = getattr(view._state, self.field)
        return column[view._at]


class LaneView:
    """One lane of a :class:`DrrState`, read through attributes; nothing is copied or kept."""

    __slots__ = ("_at", "_state")
    quantum = _Column()
    credit = _Column()
    queued = _Column()
    listed = _Column()

    def __init__(self, state: DrrState, index: int) -> None:
        self._state, self._at = state, index

    @property
    def class_active(self) -> Sequence[int]:
        return self._state.class_active[self._at] or ()

    @property
    def classes(self) -> list[ClassView]:
        state, i = self._state, self._at
        end = state.first[i + 1] if i + 1 < len(state.first) else len(state.head)
        return [ClassView(state, slot) for slot in range(state.first[i], end)]


class ClassView:
    """One class (slot) of a :class:`DrrState`: its quantum, credit and queue, read live."""

    __slots__ = ("_at", "_state")
    quantum = _Column("class_quantum")
    credit = _Column("class_credit")

    def __init__(self, state: DrrState, slot: int) -> None:
        self._state, self._at = state, slot

    @property
    def queue(self) -> list[ReadyCall]:
        """The class's calls in queue order (a copy)."""
        calls = []
        call = self._state.head[self._at]
        while call is not None:
            calls.append(call)
            call = call.behind
        return calls


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
    credit, queued, listed = state.credit, state.queued, state.listed
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
        if queued[index]:
            klass = 0 if state.class_active[index] is None else _class_head(state, index, cap)
            if klass >= 0:
                call = state.head[state.first[index] + klass]
                assert call is not None  # the lane's active class has a queue
                if call.charge <= credit[index]:
                    return Nomination(index, klass, call)
            # The visit is over: earn the next visit's quantum and go to the tail of old.
            before = credit[index]
            grant = before + state.quantum[index]
            after = grant if grant < cap else cap
            credit[index] = after
            idle = 0 if after != before else idle + 1
            rotation.popleft()
            old.append(index)
            listed[index] = OLD
        else:  # an emptied lane's placeholder reaches the head: it leaves the rotation
            rotation.popleft()
            listed[index] = UNLISTED
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
        if state.queued[index]:
            if closed and _head_call(state, index).route in closed:
                skip.add(index)
                continue
            nomination = _offer(state, index, cap)
            if nomination is not None:
                return nomination
            idle = 0 if _end_visit(state, index, cap) else idle + 1
            _leave(rotation, index)
            state.old.append(index)
            state.listed[index] = OLD
        else:
            _leave(rotation, index)
            state.listed[index] = UNLISTED
        _count_visit(state)
        if idle > len(state.new) + len(state.old):
            return None


def _offer(state: DrrState, index: int, cap: int) -> Nomination | None:
    """The lane's next call if its credit covers it, else None (its visit is over)."""
    klass = 0 if state.class_active[index] is None else _class_head(state, index, cap)
    if klass >= 0:
        call = state.head[state.first[index] + klass]
        assert call is not None
        if call.charge <= state.credit[index]:
            return Nomination(index, klass, call)
    return None


def _end_visit(state: DrrState, index: int, cap: int) -> bool:
    """Credit the lane's quantum for its next visit, up to ``cap``; False if it earned nothing."""
    before = state.credit[index]
    grant = before + state.quantum[index]
    state.credit[index] = grant if grant < cap else cap
    return state.credit[index] != before


def _head_call(state: DrrState, index: int) -> ReadyCall:
    """The call a backlogged lane offers next (its first active class's head)."""
    active = state.class_active[index]
    call = state.head[state.first[index] + (0 if active is None else active[0])]
    assert call is not None
    return call


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
    index, klass, call = nomination.lane, nomination.klass, nomination.call
    slot = state.first[index] + klass
    charge = call.charge
    credit = state.credit
    multi = state.class_active[index] is not None
    if (
        state.head[slot] is not call
        or credit[index] < charge
        or (multi and state.class_credit[slot] < charge)
    ):
        raise StaleNomination(f"nomination of {call.trajectory_id} is stale; nominate again")
    _unlink(state, slot, None, call)
    credit[index] -= charge
    state.queued[index] -= 1
    if multi:
        state.class_credit[slot] -= charge
        if state.head[slot] is None:
            _class_emptied(state, index, klass)
    if not state.queued[index]:
        _lane_emptied(state, index)


def decline(state: DrrState, nomination: Nomination) -> None:
    """Refuse the nomination: no credit changes, the call stays at the head of its queue.

    The lane goes to the tail of the old list, so the next :func:`nominate` looks at the other
    lanes first; with its credit unchanged it is nominated again on its next visit.
    Raises :class:`StaleNomination` if the call is no longer at the head of its queue.
    """
    index = nomination.lane
    if state.head[state.first[index] + nomination.klass] is not nomination.call:
        raise StaleNomination(
            f"nomination of {nomination.call.trajectory_id} is stale; nothing to decline"
        )
    rotation = state.new if state.listed[index] == NEW else state.old
    if rotation and rotation[0] == index:
        rotation.popleft()
        state.old.append(index)
        state.listed[index] = OLD
        _count_visit(state)


def enqueue(state: DrrState, lane_index: int, klass: int, call: ReadyCall) -> None:
    """Append a READY call at the tail of its class queue; an idle lane enters the new list.

    The caller has validated the call (tenant, class, size) and queues it once; this cannot
    fail.
    """
    slot = state.first[lane_index] + klass
    tail = state.tail[slot]
    if tail is None:
        state.head[slot] = call
        active = state.class_active[lane_index]
        if active is not None:
            state.class_credit[slot] = min(state.class_quantum[slot], state.credit_cap)
            active.append(klass)
    else:
        tail.behind = call
    state.tail[slot] = call
    queued = state.queued[lane_index] + 1
    state.queued[lane_index] = queued
    if queued > 1:
        return
    # Empty before: its credit was reset to zero, so it gets the quantum for its coming visit,
    # in the new list if it was out of rotation, or where its placeholder stands in old.
    state.credit[lane_index] = min(state.quantum[lane_index], state.credit_cap)
    if state.listed[lane_index] == UNLISTED:
        state.listed[lane_index] = NEW
        state.new.append(lane_index)
        if state.round_left <= 0:
            state.round_left = len(state.new) + len(state.old)


def remove(state: DrrState, lane_index: int, klass: int, call: ReadyCall) -> bool:
    """Take a call out of its queue wherever it stands (a READY trajectory paused or canceled).

    Returns False if it is not queued. An emptied class or lane has its credit reset to zero.
    """
    slot = state.first[lane_index] + klass
    ahead = None
    at = state.head[slot]
    while at is not None and at is not call:
        ahead, at = at, at.behind
    if at is None:
        return False
    _unlink(state, slot, ahead, call)
    state.queued[lane_index] -= 1
    if state.head[slot] is None and state.class_active[lane_index] is not None:
        _class_emptied(state, lane_index, klass)
    if not state.queued[lane_index]:
        _lane_emptied(state, lane_index)
    return True


def queued_calls(state: DrrState, lane: int, klass: int) -> list[ReadyCall]:
    """The calls of class ``klass`` of ``lane`` in queue order."""
    return ClassView(state, state.first[lane] + klass).queue


# --- queue and rotation bookkeeping -----------------------------------------------------------


def _unlink(state: DrrState, slot: int, ahead: ReadyCall | None, call: ReadyCall) -> None:
    """Take ``call`` out of the chain of ``slot``; ``ahead`` is the call before it (None: head)."""
    behind = call.behind
    if ahead is None:
        state.head[slot] = behind
    else:
        ahead.behind = behind
    if behind is None:
        state.tail[slot] = ahead
    call.behind = None


def _count_visit(state: DrrState) -> None:
    state.round_left -= 1
    if state.round_left <= 0:
        state.rounds += 1
        state.round_left = len(state.new) + len(state.old)


def _lane_emptied(state: DrrState, index: int) -> None:
    """Reset an emptied lane's credit; a new lane becomes a placeholder at the tail of old."""
    state.credit[index] = 0
    if state.listed[index] == NEW:
        new = state.new
        at_head = new[0] == index
        new.remove(index)
        state.old.append(index)
        state.listed[index] = OLD
        if at_head:
            _count_visit(state)
    elif state.old and state.old[0] == index:
        # An old lane that empties during its own visit leaves at once, as in FQ-CoDel;
        # elsewhere in old it stays a placeholder until its turn.
        state.old.popleft()
        state.listed[index] = UNLISTED
        _count_visit(state)


def _class_emptied(state: DrrState, index: int, klass: int) -> None:
    state.class_credit[state.first[index] + klass] = 0
    active = state.class_active[index]
    assert active is not None
    if active[0] == klass:
        active.popleft()
    else:
        active.remove(klass)


def _class_head(state: DrrState, index: int, cap: int) -> int:
    """Class number whose head call the tenant offers next, or -1 if none can ever fit.

    The inner rotation advances here and persists, so the tenant keeps offering the same call
    until it is admitted or withdrawn, and gathers tenant credit for that one call.
    """
    active = state.class_active[index]
    assert active is not None
    base = state.first[index]
    credit, quantum, head = state.class_credit, state.class_quantum, state.head
    idle = 0
    while True:
        slot = base + active[0]
        call = head[slot]
        assert call is not None
        if call.charge <= credit[slot]:
            return active[0]
        before = credit[slot]
        grant = before + quantum[slot]
        credit[slot] = grant if grant < cap else cap
        idle = 0 if credit[slot] != before else idle + 1
        active.rotate(-1)
        if idle > len(active):
            return -1
