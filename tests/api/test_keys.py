"""API keys: stored only hashed, verified, listed without the secret, revoked."""

from __future__ import annotations

import pytest
import redis

from api.keys import KeyRing, Scope, digest
from kernel.errors import InvalidInput

pytestmark = pytest.mark.redis


def test_a_key_is_stored_only_as_its_hash_and_revocation_ends_it(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    now = [0.0]
    ring = KeyRing(redis_client, key_prefix, remember_s=5.0, clock=lambda: now[0])
    key, grant = ring.create("acme", "reviewer", {Scope.READ, Scope.DECIDE})
    stored = redis_client.hgetall(ring.keys_key)
    assert list(stored) == [digest(key).encode()]
    assert key.split("_", 2)[2].encode() not in b"".join(stored.values()), "the secret was stored"
    assert ring.verify(key) == grant
    assert ring.verify(key + "x") is None
    assert [g.key_id for g in ring.grants()] == [grant.key_id]

    assert ring.revoke(grant.key_id)
    assert ring.verify(key) == grant, "remembered for remember_s"
    now[0] = 5.0
    assert ring.verify(key) is None
    assert not ring.revoke(grant.key_id)


def test_a_key_without_a_tenant_holds_only_the_operator_scope(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    ring = KeyRing(redis_client, key_prefix)
    with pytest.raises(InvalidInput, match="only the operator scope"):
        ring.create(None, "ops", {Scope.OPERATOR, Scope.SUBMIT})
    assert redis_client.hlen(ring.keys_key) == 0
