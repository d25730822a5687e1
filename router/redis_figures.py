"""The Redis admitter's figures: per tenant, what the fleet admitted and what this replica saw.

Depths, credits, admitted calls and charge are global (read from the shared state); the wait
histogram and the sliding window count this replica's own confirmations, recorded as they happen.
"""

from __future__ import annotations

from router.fairness import FairnessBook, FairnessFigures
from router.redis_state import AdmitterState


class RedisFigures:
    """Fairness figures of the shared admitter, as this replica sees them."""

    def __init__(self, state: AdmitterState) -> None:
        self._state = state
        config = state.config
        #: This replica's confirmations (fed by :class:`router.redis_confirms.ClaimEnds`).
        self.book = FairnessBook(
            names=[t.name for t in config.tenants],
            weights=[t.weight for t in config.tenants],
            wait_buckets_s=config.wait_buckets_s,
            window_s=config.fairness_window_s,
        )

    def figures(self) -> FairnessFigures:
        """Per tenant: depth and credit (global); admitted calls, waits, window (this replica)."""
        n = len(self._state.config.tenants)
        values = self._state.fields([f"q:{i}" for i in range(n)] + [f"c:{i}" for i in range(n)])
        return self.book.snapshot(self._state.time(), values[:n], values[n:])

    def admitted(self) -> list[tuple[int, int]]:
        """Per tenant, in configuration order: (calls, charge) confirmed by every replica."""
        n = len(self._state.config.tenants)
        values = self._state.fields([f"N:{i}" for i in range(n)] + [f"C:{i}" for i in range(n)])
        return list(zip(values[:n], values[n:], strict=True))
