"""API keys: who calls, for which tenant, with which scopes; stored only as hashes, in Redis.

A key reads ``rk_<key id>_<secret>``: the key id (24 hex digits, 96 random bits) names it in
listings and revocations, the secret is 32 random bytes (urlsafe base64), shown once at
creation. Redis holds ``sha256(key)`` only, in one hash ``<prefix>:api:keys`` (hex digest -> the
key's JSON grant) and an index ``<prefix>:api:key-ids`` (key id -> hex digest). A key id is
claimed in the index with ``HSETNX`` before anything else is written: an id already taken is
drawn again, so no key ever shares its id with another (which would leave the older key
unrevocable by id). The two hashes are in two slots of a Redis Cluster, so no ``MULTI`` spans
them: the index is written before the grant and the grant deleted before the index, so a key
that works is always in the index (a failure between leaves an index entry without a grant,
which lists nothing and a revocation clears). Keys made by 0.2.0 and before have 8-digit ids
and keep working.
A key of the ``operator`` scope administers the fleet and names no tenant.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any, cast

import redis
from pydantic import BaseModel, ConfigDict, Field, model_validator

from kernel.errors import InvalidInput, StoreError

REMEMBERED = 10_000  # keys whose answer a process remembers at once
KEY_ID_BYTES = 12  # 96 bits: ids drawn at random collide about once in 2**48 keys
ID_DRAWS = 8  # ids drawn before giving up: a second collision in a row means a broken source
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$"


class Scope(StrEnum):
    """What a key may do."""

    SUBMIT = "submit"  # create trajectories
    READ = "read"  # see trajectories, their events, traces, approvals and usage
    CONTROL = "control"  # pause, resume, cancel, kill, interrupt
    DECIDE = "decide"  # approve or deny held actions (as the key's principal)
    OPERATOR = "operator"  # the fleet: ring, drain, remove; every tenant's usage


TENANT_SCOPES = frozenset({Scope.SUBMIT, Scope.READ, Scope.CONTROL, Scope.DECIDE})


class Grant(BaseModel):
    """What one key grants: its tenant (None for an operator key), principal and scopes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    tenant: str | None = Field(None, pattern=_NAME)
    principal: str = Field(pattern=_NAME)
    scopes: frozenset[Scope]
    created_at: float
    note: str = ""

    @model_validator(mode="after")
    def _tenant_or_operator(self) -> Grant:
        if self.tenant is None and self.scopes - {Scope.OPERATOR}:
            raise ValueError("a key without a tenant may hold only the operator scope")
        if not self.scopes:
            raise ValueError("a key needs at least one scope")
        return self

    def has(self, scope: Scope) -> bool:
        """True when this key holds ``scope``."""
        return scope in self.scopes


def digest(key: str) -> str:
    """The stored form of a key: its sha256, hex."""
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Create, verify, list and revoke API keys under one prefix (see the module docstring).

    With ``remember_s`` above 0, :meth:`verify` remembers each answer that long (at most
    :data:`REMEMBERED` keys), so a revocation takes effect within ``remember_s`` in a process
    that saw the key just before.
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        *,
        remember_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = lambda: secrets.token_hex(KEY_ID_BYTES),
    ) -> None:
        self.client = client
        self.keys_key = f"{prefix}:api:keys"
        self.ids_key = f"{prefix}:api:key-ids"
        self.remember_s, self.clock, self.new_id = remember_s, clock, new_id
        self._seen: dict[str, tuple[float, Grant | None]] = {}

    def create(
        self,
        tenant: str | None,
        principal: str,
        scopes: frozenset[Scope] | set[Scope],
        note: str = "",
    ) -> tuple[str, Grant]:
        """A new key and its grant; the key itself is returned once and stored only hashed.
        Its id is one no other key holds (claimed in the index first); bad input writes
        nothing."""
        try:
            Grant(
                key_id="-",
                tenant=tenant,
                principal=principal,
                scopes=frozenset(scopes),
                created_at=0.0,
                note=note,
            )
        except ValueError as exc:
            raise InvalidInput(f"key refused: {exc}") from None
        for _ in range(ID_DRAWS):
            key_id = self.new_id()
            key = f"rk_{key_id}_{secrets.token_urlsafe(32)}"
            hashed = digest(key)
            if self.client.hsetnx(self.ids_key, key_id, hashed):  # the index first
                break
        else:
            raise StoreError(f"no free key id in {ID_DRAWS} draws: the id source repeats itself")
        grant = Grant(
            key_id=key_id,
            tenant=tenant,
            principal=principal,
            scopes=frozenset(scopes),
            created_at=time.time(),
            note=note,
        )
        self.client.hset(self.keys_key, hashed, grant.model_dump_json())
        return key, grant

    def verify(self, key: str) -> Grant | None:
        """The grant of ``key``, or None for a key that is unknown or revoked."""
        if not key.startswith("rk_") or len(key) > 200:
            return None
        hashed, now = digest(key), self.clock()
        seen = self._seen.get(hashed)
        if seen is not None and now - seen[0] < self.remember_s:
            return seen[1]
        raw = self.client.hget(self.keys_key, hashed)
        grant = None if raw is None else Grant.model_validate_json(cast(bytes, raw))
        if self.remember_s > 0:
            if len(self._seen) >= REMEMBERED:
                self._seen.clear()
            self._seen[hashed] = (now, grant)
        return grant

    def current(self, hashed: str) -> Grant | None:
        """The grant of the key whose digest is ``hashed`` as Redis holds it now, never a
        remembered answer: None as soon as the key is revoked."""
        raw = self.client.hget(self.keys_key, hashed)
        return None if raw is None else Grant.model_validate_json(cast(bytes, raw))

    def grants(self) -> list[Grant]:
        """Every live key's grant, by tenant then key id."""
        raw = cast(dict[bytes, bytes], self.client.hgetall(self.keys_key))
        found = [Grant.model_validate_json(v) for v in raw.values()]
        return sorted(found, key=lambda g: (g.tenant or "", g.key_id))

    def revoke(self, key_id: str) -> bool:
        """Revoke the key ``key_id``; False if there is none."""
        hashed = self.client.hget(self.ids_key, key_id)
        if hashed is None:
            return False
        self.client.hdel(self.keys_key, cast(bytes, hashed).decode())  # the key stops working
        self.client.hdel(self.ids_key, key_id)
        return True


def grant_summary(grant: Grant) -> dict[str, Any]:
    """A grant as plain JSON, for listings."""
    data = json.loads(grant.model_dump_json())
    data["scopes"] = sorted(data["scopes"])
    return cast(dict[str, Any], data)
