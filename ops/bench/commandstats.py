"""Redis's own CPU per command, from ``INFO commandstats`` read around a bench's phases.

The counters are differenced, never reset (``CONFIG RESETSTAT`` would wipe them for every other
client of a shared server, and a per-phase difference needs no reset). On a shared server
another client may run the same command during a phase: a window whose call count is not
exactly the phase's own is left out and counted, never silently averaged in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster

from store.redis_client import is_cluster


class Tally(NamedTuple):
    """One command's calls and microseconds so far (a cluster's masters summed)."""

    calls: int
    usec: int


def tally(client: redis.Redis, command: str) -> Tally:
    """``INFO commandstats`` for ``command`` (lower case, as Redis names it: ``evalsha``)."""
    stats: Callable[..., Any] = client.info
    if is_cluster(client):
        per_node = stats("commandstats", target_nodes=RedisCluster.PRIMARIES)
        one = any(str(key).startswith("cmdstat_") for key in per_node)  # a single master
        nodes = [per_node] if one else list(per_node.values())
    else:
        nodes = [stats("commandstats")]
    entries = [node.get(f"cmdstat_{command}", {}) for node in nodes]
    return Tally(
        sum(int(e.get("calls", 0)) for e in entries), sum(int(e.get("usec", 0)) for e in entries)
    )


@dataclass
class ServerTime:
    """The server's microseconds for one command over the phases that ran it, kept only from
    windows where it ran exactly the phase's own calls."""

    calls: int = 0
    usec: int = 0
    windows: int = 0
    left_out: int = 0

    def add(self, before: Tally, after: Tally, own_calls: int) -> None:
        """Count one phase's window: ``own_calls`` is how many the phase itself sent."""
        self.windows += 1
        if after.calls - before.calls != own_calls:  # another client's, or a reset
            self.left_out += 1
            return
        self.calls += own_calls
        self.usec += after.usec - before.usec

    def us_per_call(self) -> float | None:
        """Microseconds per call over the windows kept; None when none was."""
        return round(self.usec / self.calls, 2) if self.calls else None
