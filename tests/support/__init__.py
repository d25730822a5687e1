"""What every test shares: a clock the test moves, and the one bounded wait."""

from tests.support.clock import ManualClock
from tests.support.waiting import wait_for

__all__ = ["ManualClock", "wait_for"]
