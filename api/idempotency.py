"""``Idempotency-Key`` on submissions: the same key and body name the same trajectory.

Per tenant, ``<prefix>:api:idem:<tenant>:<sha256 of the key>`` holds the body's digest and the
trajectory id chosen for it, set with ``SET NX`` before the trajectory is created, for a day.
A repeat with the same body is told that trajectory; with another body, it is refused. A
submission that is refused releases its key, so a corrected body may use it again.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any, cast

import redis

KEEP_S = 86_400


@dataclass(frozen=True, slots=True)
class Binding:
    """What an idempotency key is bound to: the body's digest and the trajectory chosen for it."""

    body_digest: str
    trajectory_id: str
    fresh: bool  # True: this request took the key and must create the trajectory


def body_digest(body: dict[str, Any]) -> str:
    """A digest of a job body, independent of key order."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class IdempotencyKeys:
    """The keys of submissions under one prefix (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client, self.prefix = client, prefix

    def _key(self, tenant: str, key: str) -> str:
        return f"{self.prefix}:api:idem:{tenant}:{hashlib.sha256(key.encode()).hexdigest()}"

    def bind(self, tenant: str, key: str, body: dict[str, Any]) -> Binding:
        """Bind ``key`` to ``body`` and a new trajectory id (fresh), or read what it names."""
        digest = body_digest(body)
        proposed = f"traj-{uuid.uuid4().hex[:16]}"
        value = json.dumps({"b": digest, "t": proposed})
        where = self._key(tenant, key)
        if self.client.set(where, value, nx=True, ex=KEEP_S):
            return Binding(digest, proposed, True)
        raw = self.client.get(where)
        if raw is None:  # released meanwhile: take it again
            return self.bind(tenant, key, body)
        held = json.loads(cast(bytes, raw))
        return Binding(held["b"], held["t"], False)

    def release(self, tenant: str, key: str) -> None:
        """Free ``key`` after a refused submission."""
        self.client.delete(self._key(tenant, key))
