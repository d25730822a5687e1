"""A tool backend whose writes are in flight for a while: the zombie test's worker backend.

``reins worker --backend tests.fleet.paced_backend:paced_support_store`` gives the support
store's shared Redis state, made as a service that cannot de-duplicate (only fences keep a late
write out), behind :class:`PacedBackend`: each write waits :data:`WRITE_PACE_S` in the worker
thread before it reaches the store, as a write crossing a slow network would. While it waits it
is listed, with its fence, under ``P:paced:<pid>`` (a hash: idempotency key -> fence), so a test
sees which writes a worker process has in flight; each lookup answered is listed, with its fence,
under ``P:paced:looked``; every paced write's span, under ``P:paced:spans``.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.agent import AgentModule
from kernel.settings import Settings
from kernel.tools import ToolBackend, ToolKind

WRITE_PACE_S = 2.5


def in_flight_key(prefix: str, pid: int) -> str:
    """The hash of the writes process ``pid`` has in flight (idempotency key -> fence)."""
    return f"{prefix}:paced:{pid}"


def spans_key(prefix: str) -> str:
    """The list of every paced write's [tool, start, end] (epoch seconds), as JSON."""
    return f"{prefix}:paced:spans"


def looked_up_key(prefix: str) -> str:
    """The hash of the lookups answered (idempotency key -> the fence of the latest)."""
    return f"{prefix}:paced:looked"


class PacedBackend:
    """Wraps a backend: a write reaches it only after ``pace_s``; reads and lookups at once."""

    def __init__(
        self,
        inner: ToolBackend,
        writes: frozenset[str],
        client: redis.Redis,
        prefix: str,
        pace_s: float = WRITE_PACE_S,
    ) -> None:
        self.inner, self.writes, self.client, self.pace_s = inner, writes, client, pace_s
        self.listed = in_flight_key(prefix, os.getpid())
        self.looked = looked_up_key(prefix)
        self.spans = spans_key(prefix)

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        if tool not in self.writes:
            return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)
        self.client.hset(self.listed, key, fence)
        began = time.time()
        try:
            time.sleep(self.pace_s)
            return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)
        finally:
            self.client.hdel(self.listed, key)
            self.client.rpush(self.spans, json.dumps([tool, began, time.time()]))

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        answer = self.inner.lookup(tool, key, fence=fence)
        self.client.hset(self.looked, key, fence)
        return answer


def paced_support_store(agent: AgentModule, settings: Settings, client: redis.Redis) -> ToolBackend:
    """The shared support store, not de-duplicating, with its writes paced (module docstring)."""
    state = RedisState(client, settings.key_prefix, seed=False, deduplicate=False)
    catalog = agent.profile.catalog
    writes = frozenset(name for name, spec in catalog.tools.items() if spec.kind is ToolKind.WRITE)
    return PacedBackend(SupportStoreBackend(state), writes, client, settings.key_prefix)
