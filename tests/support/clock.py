"""A clock the test moves by hand: injected wherever the code under test reads the time."""

from __future__ import annotations


class ManualClock:
    """Seconds that pass only when the test says so (``advance`` or ``set``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds``."""
        self.now += seconds

    def set(self, now: float) -> None:
        """Move the clock to ``now``."""
        self.now = now
