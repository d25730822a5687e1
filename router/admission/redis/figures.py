"""The Redis admitter's figures: per tenant, what the fleet admitted and what this replica saw.

Depths, credits, admitted calls and charge are global (read from the shared state); the wait
histogram and the sliding window count this replica's own confirmations, recorded as they happen.
"""

from __future__ import annotations

from router.admission.fairness import FairnessBook, FairnessFigures
from router.admission.redis.state import AdmitterState
from router.admission.tenants import AdmissionConfig


class RedisFigures:
    """Fairness figures of the shared admitter, as this replica sees them."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        self._rebook()

    def _rebook(self) -> None:
        config = self._book_of = self._state.config
        self.book = _book(config)
        self._at = {t.name: i for i, t in enumerate(config.tenants)}

    def record(self, tenant: str, charge: int, wait_s: float, now: float) -> None:
        """Count one of this replica's confirmations (a retired tenant's is not shown)."""
        if self._book_of is not self._state.config:  # reconfigured: figures of the new tenants
            self._rebook()
        at = self._at.get(tenant)
        if at is not None:
            self.book.record(at, charge, wait_s, now)

    def figures(self) -> FairnessFigures:
        """Per tenant: depth and credit (global); admitted calls, waits, window (this replica)."""
        if self._book_of is not self._state.config:
            self._rebook()
        lanes = self._state.lanes.configured
        n = len(lanes)
        values = self._state.fields([f"q:{i}" for i in lanes] + [f"c:{i}" for i in lanes])
        return self.book.snapshot(self._state.time(), values[:n], values[n:])

    def admitted(self) -> list[tuple[int, int]]:
        """Per tenant, in configuration order: (calls, charge) confirmed by every replica."""
        lanes = self._state.lanes.configured
        n = len(lanes)
        values = self._state.fields([f"N:{i}" for i in lanes] + [f"C:{i}" for i in lanes])
        return list(zip(values[:n], values[n:], strict=True))


def _book(config: AdmissionConfig) -> FairnessBook:
    return FairnessBook(
        names=[t.name for t in config.tenants],
        weights=[t.weight for t in config.tenants],
        wait_buckets_s=config.wait_buckets_s,
        window_s=config.fairness_window_s,
    )
