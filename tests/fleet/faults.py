"""Tool backends that misbehave the way a real dependency does, for workers under test.

``reins worker --backend tests.fleet.faults:hung_support_store`` gives a worker the shared
support-store backend whose refunds hang for ever (a dependency that accepted the connection and
never answers): every consumer thread that reaches one is stuck, as in a real wedge.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.agent import AgentModule
from kernel.settings import Settings
from kernel.tools import ToolBackend

_NEVER = threading.Event()  # nothing sets it


class HungRefunds(SupportStoreBackend):
    """The support store, except that a refund never returns (and never takes effect)."""

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
        if tool == "issue_refund":
            _NEVER.wait()
        return super().call(user, tool, args, key, timeout_s, approval, fence=fence)


def hung_support_store(agent: AgentModule, settings: Settings, client: redis.Redis) -> ToolBackend:
    """The shared support store of ``settings``'s prefix, with refunds that hang."""
    return HungRefunds(RedisState(client, settings.key_prefix))
