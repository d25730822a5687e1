"""Tool backends that misbehave the way a real dependency does, for workers under test.

``reins worker --backend tests.fleet.faults:undeduplicated_store`` gives a worker the shared
support-store backend as a service that cannot de-duplicate: a write sent twice under one key
runs twice, so only reins's own discipline (register before send, look up before re-sending,
fences) keeps effects single; every write it is sent is counted (``RedisState.write_attempts``).

``reins worker --backend tests.fleet.faults:hung_support_store`` gives a worker the shared
support-store backend whose refunds hang for ever (a dependency that accepted the connection and
never answers): every consumer thread that reaches one is stuck, as in a real wedge.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import redis

from examples.support_store.backend import WRITES, SupportStoreBackend
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
    return HungRefunds(RedisState(client, settings.key_prefix, deduplicate=False))


#: How long a write's answer takes to come back after its effect: a worker killed meanwhile
#: leaves an effect whose outcome its run does not know.
ANSWER_S = 0.4


def answering_key(prefix: str, pid: int) -> str:
    """The hash of the writes process ``pid`` awaits the answer of (idempotency key -> tool)."""
    return f"{prefix}:answering:{pid}"


class SlowAnswers(SupportStoreBackend):
    """The support store, whose writes answer :data:`ANSWER_S` after they took effect; while
    one's answer is on its way it is listed under :func:`answering_key`."""

    def __init__(self, state: RedisState, prefix: str) -> None:
        super().__init__(state)
        self.client, self.listed = state.r, answering_key(prefix, os.getpid())

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
        result = super().call(user, tool, args, key, timeout_s, approval, fence=fence)
        if tool in WRITES:
            self.client.hset(self.listed, key, tool)
            time.sleep(ANSWER_S)  # the answer on its way back, as over a slow network
            self.client.hdel(self.listed, key)
        return result


def undeduplicated_store(
    agent: AgentModule, settings: Settings, client: redis.Redis
) -> ToolBackend:
    """The shared support store of ``settings``'s prefix, as a service that cannot
    de-duplicate and answers writes slowly (module docstring)."""
    state = RedisState(client, settings.key_prefix, deduplicate=False)
    return SlowAnswers(state, settings.key_prefix)


class AppliedThenHung(SupportStoreBackend):
    """The support store (cannot de-duplicate), except that a refund takes effect and its
    answer never comes back: the worker holding it is as good as dead after the effect."""

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
        result = super().call(user, tool, args, key, timeout_s, approval, fence=fence)
        if tool == "issue_refund":
            _NEVER.wait()
        return result


def applied_then_hung_store(
    agent: AgentModule, settings: Settings, client: redis.Redis
) -> ToolBackend:
    """The shared support store of ``settings``'s prefix whose refunds take effect and hang."""
    return AppliedThenHung(RedisState(client, settings.key_prefix, deduplicate=False))


#: Where :func:`external_undeduplicated_store` keeps its state (not a REINS_ setting: the
#: backend is another system, on another Redis than the fleet's).
BACKEND_URL_VAR = "TEST_ONLY_BACKEND_REDIS_URL"


def external_undeduplicated_store(
    agent: AgentModule, settings: Settings, client: redis.Redis
) -> ToolBackend:
    """The support store as a service that cannot de-duplicate, its state on the Redis at
    :data:`BACKEND_URL_VAR`: a store of its own, which survives whatever the fleet's Redis
    loses."""
    own = redis.Redis.from_url(os.environ[BACKEND_URL_VAR])
    return SupportStoreBackend(RedisState(own, settings.key_prefix, deduplicate=False))
