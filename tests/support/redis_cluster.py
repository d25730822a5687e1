"""A three-master Redis Cluster of the test session's own, on free loopback ports.

The processes are :class:`ops.local.cluster.LocalCluster`'s (``reins bench store --cluster``
starts the same). The fixtures: ``redis_cluster_url`` (session-scoped) yields its URL,
``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``, the scheme
:func:`store.redis_client.client_from_url` turns into a ``RedisCluster``; with
``REINS_TEST_REDIS_CLUSTER_URL`` set, that cluster is used instead and nothing is started.
``redis_cluster`` is a client to it, and ``cluster_key_prefix`` a prefix of the test's own
whose keys are deleted from every master after the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis

from ops.local.cluster import LocalCluster
from store.redis_client import client_from_url

__all__ = [
    "LocalCluster",
    "cluster_key_prefix",
    "prefix_deleted_after",
    "redis_cluster",
    "redis_cluster_url",
]


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a three-master cluster up for the whole session (see the module docstring)."""
    given = os.environ.get("REINS_TEST_REDIS_CLUSTER_URL")
    if given:
        yield given
        return
    cluster = LocalCluster(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(redis_cluster_url: str) -> Iterator[redis.Redis]:
    """A cluster client (``RedisCluster``, typed as the ``Redis`` it answers for)."""
    client = client_from_url(redis_cluster_url, connect_timeout_s=5, timeout_s=5)
    yield client
    client.close()


def prefix_deleted_after(client: redis.Redis) -> Iterator[str]:
    """Yield a prefix no other test uses; then delete every key under it (on every master of
    a cluster: its ``scan_iter`` visits each, and its ``delete`` splits the keys by slot)."""
    prefix = f"reins-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    keys += list(client.scan_iter(match=f"{{{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def cluster_key_prefix(redis_cluster: redis.Redis) -> Iterator[str]:
    """A prefix no other test uses; every key under it, on every master, is deleted after."""
    yield from prefix_deleted_after(redis_cluster)
