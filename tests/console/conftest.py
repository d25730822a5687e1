"""Fixtures of the console's tests: those of the API's tests (the fleet's document, keys, the
application in process, a held refund), and the store they write to."""

from __future__ import annotations

import pytest
import redis

from store.redis_store import RedisStore
from tests.api.conftest import (  # noqa: F401 - fixtures, found by name
    acme_held,
    api_env,
    applied,
    fleet,
    fleet_file,
    http,
    keys,
)


@pytest.fixture
def store(redis_client: redis.Redis, key_prefix: str) -> RedisStore:
    """The store of this test's prefix."""
    return RedisStore(redis_client, prefix=key_prefix)
