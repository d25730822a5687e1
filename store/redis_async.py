"""An asyncio client of the store's Redis, for the API's event streams: one node, a Sentinel
master or a Redis Cluster, chosen by the URL as :func:`store.redis_client.client_from_url`
chooses its blocking twin, with the same timeouts."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis.asyncio
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from kernel.errors import ConfigError
from kernel.settings import Settings
from store.redis_client import CLUSTER_SCHEMES, SENTINEL_SCHEMES, _credentials, _hosts


def async_client_for(settings: Settings) -> Any:
    """``redis.asyncio`` client of ``REINS_REDIS_URL`` (a cluster client for a cluster URL or
    ``REINS_REDIS_CLUSTER``); a bad URL is refused naming the setting. Connects on first use."""
    url, setting = settings.redis_url, "REINS_REDIS_URL"
    common: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": settings.redis_timeout_s,
    }
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    extra: dict[str, Any] = {**common, **_credentials(parts.netloc)}
    if scheme.startswith("rediss"):
        extra["ssl"] = True
    try:
        if scheme in SENTINEL_SCHEMES:
            path = [p for p in parts.path.split("/") if p]
            if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
                raise ConfigError(
                    f"{setting}: a Sentinel URL is redis+sentinel://host:port[,host:port]/service[/db]"
                )
            sentinel = Sentinel(_hosts(parts.netloc, setting), **common)  # type: ignore[no-untyped-call, unused-ignore]
            db = int(path[1]) if len(path) == 2 else 0
            return sentinel.master_for(path[0], db=db, **extra)
        if scheme in CLUSTER_SCHEMES or settings.redis_cluster:
            if scheme in CLUSTER_SCHEMES:
                nodes = _hosts(parts.netloc, setting)
            else:
                nodes = [(parts.hostname or "127.0.0.1", parts.port or 6379)]
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in nodes], **extra
            )
        return redis.asyncio.Redis.from_url(url, **common)
    except ValueError as exc:
        raise ConfigError(f"{setting}: {exc}") from None
