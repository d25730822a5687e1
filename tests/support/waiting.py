"""The one bounded wait of the tests: poll a condition that another process makes true.

It is the fleet's own (``ops.local.fleet.wait_for``, which the benchmarks use too): a test that
waits on its own process's state has nothing asynchronous to wait for and must not use it.
"""

from __future__ import annotations

from ops.local.fleet import wait_for

__all__ = ["wait_for"]
