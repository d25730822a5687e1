"""Shared fixtures: an isolated key prefix on the running Redis, cleaned up after each test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.redis_cluster import (  # noqa: F401 - fixtures, found by name
    cluster_key_prefix,
    prefix_deleted_after,
    redis_cluster,
    redis_cluster_url,
)

REDIS_URL = os.environ.get("REINS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(autouse=True)
def embedded_store_outside_the_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`reins run` keeps runs in the embedded SQLite store; in tests it lives in tmp_path."""
    monkeypatch.setenv("REINS_SQLITE_PATH", str(tmp_path) + "/reins.db")


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    """A client to the running Redis (127.0.0.1:6379 unless REINS_TEST_REDIS_URL says)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:  # pragma: no cover - make test starts Redis
        pytest.fail(f"Redis is not running at {REDIS_URL}: run 'make redis' ({exc})")
    yield client
    client.close()


@pytest.fixture
def key_prefix(redis_client: redis.Redis) -> Iterator[str]:
    """A prefix no other test uses; every key under it is deleted after the test."""
    yield from prefix_deleted_after(redis_client)
