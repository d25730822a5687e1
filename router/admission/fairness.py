"""Fairness figures of the admitter: what each tenant got, how long it waited, how even it was.

:class:`FairnessBook` is fed one :meth:`~FairnessBook.record` per admitted call (on the
admission hot path: O(1) work on plain lists) and produces a :class:`FairnessFigures` snapshot
on demand. Its Jain's index is over weight-normalised charge in a sliding window, counting every
tenant admitted in the window or with calls queued now: 1 when each got charge in proportion to
its weight, toward 1/n as one takes everything. Design: ``docs/adr/0002-fairness-figures.md``.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index of non-negative values; None for an empty sequence or all zeros."""
    total = sum(values)
    squares = sum(v * v for v in values)
    if not values or squares == 0:
        return None
    return total * total / (len(values) * squares)


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant's figures at the time of a snapshot."""

    tenant: str
    weight: float
    admitted_calls: int
    admitted_charge: int
    queue_depth: int
    credit: int
    window_charge: int
    #: ``(upper bound in seconds, count)`` per bucket, cumulative as Prometheus expects;
    #: the last bound is ``inf``.
    wait_buckets: tuple[tuple[float, int], ...]
    wait_sum_s: float


@dataclass(frozen=True, slots=True)
class FairnessFigures:
    """A snapshot across tenants; ``jain_index`` is None when no tenant is counted."""

    at: float
    window_s: float
    jain_index: float | None
    tenants: tuple[TenantFigures, ...]

    def tenant(self, name: str) -> TenantFigures:
        """The figures of one tenant; KeyError if it is not configured."""
        for t in self.tenants:
            if t.tenant == name:
                return t
        raise KeyError(name)


#: The sliding window moves in steps of ``window_s / WINDOW_SLOTS`` (1 s of a 60 s window).
WINDOW_SLOTS = 60


class FairnessBook:
    """Running counters per tenant (indexed like the scheduler's lanes) and a sliding window.

    The window is kept as per-slot charge totals rather than one entry per admission, so
    :meth:`record` costs a comparison and an addition for it. The counters are flat arrays
    indexed by lane, not an object per tenant: the rotation visits lanes nearly in order, so
    with thousands of tenants one cache line holds the counters of the next eight lanes
    (ADR 0191).
    """

    __slots__ = (
        "_bounds",
        "_buckets",
        "_charge",
        "_current",
        "_hist",
        "_names",
        "_slot_end",
        "_slot_index",
        "_slot_s",
        "_slots",
        "_wait_sum",
        "_weights",
        "_window_s",
    )

    def __init__(
        self,
        names: Sequence[str],
        weights: Sequence[float],
        wait_buckets_s: Sequence[float],
        window_s: float,
    ) -> None:
        self._names = tuple(names)
        self._weights = tuple(weights)
        self._bounds = tuple(wait_buckets_s)
        self._window_s = window_s
        count = len(self._names)
        self._charge = array("q", bytes(8 * count))
        self._wait_sum = array("d", bytes(8 * count))
        # lane * buckets + bucket; a lane's last bucket counts waits above the largest bound.
        # A lane's calls are the sum of its buckets: one counter less to write per admission.
        self._buckets = len(self._bounds) + 1
        self._hist = array("q", bytes(8 * count * self._buckets))
        self._slot_s = window_s / WINDOW_SLOTS
        # (slot index, charge by tenant index): sparse, so a slot costs the tenants it admitted,
        # not every configured tenant (10,000 of them turn a 1 s roll into a 10,000-entry list)
        self._slots: deque[tuple[int, dict[int, int]]] = deque()
        self._current: dict[int, int] = {}
        self._slot_index = 0
        self._slot_end = self._slot_s

    def record(self, lane: int, charge: int, wait_s: float, now: float) -> None:
        """Count one admitted call of tenant ``lane`` that waited ``wait_s`` seconds, at ``now``."""
        self._charge[lane] += charge
        self._wait_sum[lane] += wait_s
        self._hist[lane * self._buckets + bisect_left(self._bounds, wait_s)] += 1
        if now >= self._slot_end:
            self._roll(now)
        current = self._current
        current[lane] = current.get(lane, 0) + charge

    def _roll(self, now: float) -> None:
        """Close the current slot, open the one holding ``now``, drop slots out of the window."""
        if self._current:
            self._slots.append((self._slot_index, self._current))
            self._current = {}
        index = int(now // self._slot_s)
        self._slot_index = index
        self._slot_end = (index + 1) * self._slot_s
        slots = self._slots
        while slots and slots[0][0] <= index - WINDOW_SLOTS:
            slots.popleft()

    def snapshot(
        self, now: float, queue_depths: Sequence[int], credits: Sequence[int]
    ) -> FairnessFigures:
        """Figures as of ``now``; depths and credits come from the scheduler state."""
        if now >= self._slot_end:
            self._roll(now)
        window = [0] * len(self._names)
        for charges in (self._current, *(charges for _, charges in self._slots)):
            for i, c in charges.items():
                window[i] += c
        tenants = []
        normalised = []
        width = self._buckets
        for i, name in enumerate(self._names):
            running = 0
            buckets = []
            hist = self._hist[i * width : (i + 1) * width]
            for bound, count in zip((*self._bounds, float("inf")), hist, strict=True):
                running += count
                buckets.append((bound, running))
            tenants.append(
                TenantFigures(
                    tenant=name,
                    weight=self._weights[i],
                    admitted_calls=running,  # the last cumulative count: every call
                    admitted_charge=self._charge[i],
                    queue_depth=queue_depths[i],
                    credit=credits[i],
                    window_charge=window[i],
                    wait_buckets=tuple(buckets),
                    wait_sum_s=self._wait_sum[i],
                )
            )
            if window[i] or queue_depths[i]:
                normalised.append(window[i] / self._weights[i])
        return FairnessFigures(
            at=now,
            window_s=self._window_s,
            jain_index=jain_index(normalised),
            tenants=tuple(tenants),
        )
