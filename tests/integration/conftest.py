"""Fixtures of the integration tests on the running Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store.redis_client import client_from_url
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL


@pytest.fixture
def redis_store(key_prefix: str) -> Iterator[RedisStore]:
    """The Redis store under the test's own prefix (its keys deleted after)."""
    made = RedisStore(client_from_url(REDIS_URL), prefix=key_prefix)
    yield made
    made.close()
