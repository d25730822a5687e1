"""Fixtures of the integration tests: the running Redis, and a Redis server of a test's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from store.redis_client import client_from_url
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.support.redis_server import OwnRedis


@pytest.fixture
def redis_store(key_prefix: str) -> Iterator[RedisStore]:
    """The Redis store under the test's own prefix (its keys deleted after)."""
    made = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    yield made
    made.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A Redis server of the test's own (on a free loopback port), stopped after."""
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()
