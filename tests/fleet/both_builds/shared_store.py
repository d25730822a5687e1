"""The support store as one service that the workers of two builds call, for the two-build
rolling upgrade (``tests/fleet/test_two_builds.py``).

This directory is put on ``PYTHONPATH`` of the older build's processes and of this build's
(``reins worker --backend shared_store:undeduplicated``), so it must use only what both builds
have: ``RedisState(client, prefix, deduplicate=...)`` and its ``write_once(key, tool,
order_id, fn, fence)``, unchanged since 0.2.0. The service cannot de-duplicate (a write sent
twice runs twice, so it shows in the effects), and it counts every write it receives, whether
its fence lets it through or not, under ``<prefix>:store:received`` (``"<tool> <key>"`` ->
count): a write that reins sent more than once shows there as more than one, whichever build
sent it.
"""

from __future__ import annotations

from typing import Any

import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState

RECEIVED = "received"


class Counting(RedisState):
    """The shared state, counting each write it receives before it judges it."""

    def write_once(self, key: str, tool: str, *args: Any, **kwargs: Any) -> Any:
        self.r.hincrby(f"{self.p}:{RECEIVED}", f"{tool} {key}", 1)
        return super().write_once(key, tool, *args, **kwargs)


def undeduplicated(agent: Any, settings: Any, client: redis.Redis) -> SupportStoreBackend:
    """The backend of a worker of either build: the shared store of ``settings``'s prefix."""
    return SupportStoreBackend(Counting(client, settings.key_prefix, deduplicate=False))


def received(client: redis.Redis, prefix: str) -> dict[str, int]:
    """Every write the service received, by ``"<tool> <key>"``: how many times."""
    raw: dict[bytes, bytes] = client.hgetall(f"{prefix}:store:{RECEIVED}")  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}
