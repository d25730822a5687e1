"""API keys: stored only hashed, verified, listed without the secret, revoked."""

from __future__ import annotations

import pytest
import redis

from api.keys import KeyRing, Scope, digest
from kernel.errors import InvalidInput, StoreError

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


def test_key_ids_hold_96_random_bits_and_a_taken_id_is_never_given_again(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    drawn = KeyRing(redis_client, key_prefix)
    key, grant = drawn.create("acme", "reviewer", {Scope.READ})
    assert len(grant.key_id) == 24 and int(grant.key_id, 16) >= 0  # 12 bytes, hex
    assert key.startswith(f"rk_{grant.key_id}_")

    # an id source that repeats the first key's id once: the second key gets another id, and
    # both keys stay revocable by their own ids (an overwritten index would revoke the wrong one)
    ids = iter([grant.key_id, "b" * 24])
    ring = KeyRing(redis_client, key_prefix, new_id=lambda: next(ids))
    second_key, second = ring.create("acme", "auditor", {Scope.READ})
    assert second.key_id == "b" * 24 != grant.key_id
    assert ring.verify(key) == grant and ring.verify(second_key) == second
    assert ring.revoke(grant.key_id)
    assert ring.verify(key) is None, "the first key outlived the revocation of its id"
    assert ring.verify(second_key) == second, "revoking one id ended another key"
    assert ring.revoke(second.key_id) and ring.verify(second_key) is None
    assert drawn.grants() == []


def test_an_id_source_that_only_repeats_gives_up_and_writes_no_grant(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    ring = KeyRing(redis_client, key_prefix)
    _, grant = ring.create("acme", "reviewer", {Scope.READ})
    stuck = KeyRing(redis_client, key_prefix, new_id=lambda: grant.key_id)
    with pytest.raises(StoreError, match="no free key id"):
        stuck.create("acme", "auditor", {Scope.READ})
    assert [g.key_id for g in ring.grants()] == [grant.key_id]
