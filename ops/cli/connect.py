"""The fleet's Redis for one CLI command: the configured client, closed after, and a Redis
failure turned into one error line that says what to do (every command that reads or writes
the fleet's Redis directly: ring, doctor, keys, config)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from kernel.errors import StoreError
from kernel.settings import Settings
from store.redis_client import client_for


@contextmanager
def fleet_redis(settings: Settings | None = None) -> Iterator[tuple[Settings, redis.Redis]]:
    """The settings (from the environment unless given) and the store's Redis client."""
    settings = settings or Settings.from_env(os.environ)
    client = client_for(settings)
    try:
        yield settings, client
    except redis.ConnectionError as exc:
        raise StoreError(
            f"Redis at {settings.redis_url} (REINS_REDIS_URL) does not answer: {exc}; start it "
            "('make redis') or set REINS_REDIS_URL to the fleet's Redis"
        ) from None
    except redis.RedisError as exc:
        raise StoreError(
            f"Redis at {settings.redis_url}: {exc}; is REINS_KEY_PREFIX "
            f"({settings.key_prefix!r}) a reins fleet of this build?"
        ) from None
    finally:
        client.close()
