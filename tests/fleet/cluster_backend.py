"""The support store's backend for a fleet whose state is on a Redis Cluster.

The support store stands for the agent's own service, not for reins's state: its writes are
WATCH/MULTI transactions over keys of several slots, as a service of one Redis may write them.
So on a cluster fleet it stays on the single Redis, the broker's
(``reins worker --backend tests.fleet.cluster_backend:support_store_on_broker``).
"""

from __future__ import annotations

import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.agent import AgentModule
from kernel.settings import Settings
from kernel.tools import ToolBackend
from store.redis_client import client_for


def support_store_on_broker(
    agent: AgentModule, settings: Settings, client: redis.Redis
) -> ToolBackend:
    """The support store on the broker's Redis, under ``<REINS_KEY_PREFIX>:store``."""
    return SupportStoreBackend(RedisState(client_for(settings, broker=True), settings.key_prefix))
