"""Console sessions, kept server-side in Redis: a browser holds only a random session id.

Signing in opens a session for the key just verified: a random id (32 bytes, urlsafe base64;
never an API key, so it is refused as one on ``/v1``) goes to the browser, and Redis keeps, under
the id's sha256, the key's sha256 and when the session was opened and last used. A session
lapses ``idle_s`` after its last use or ``lifetime_s`` after it was opened, whichever is first.
Every use (:meth:`ConsoleSessions.grant_of`) checks both, marks the session used, and reads the
key's grant from Redis as it is now (never a remembered answer), so revoking the key or
signing out (:meth:`ConsoleSessions.close`) ends the session at its very next request. The
hash also expires on the server after ``idle_s`` without use, so nothing is left behind.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections.abc import Callable
from typing import Any, cast

import redis

from api.keys import Grant, KeyRing
from store.scripts import scripts_beside

SCRIPTS = scripts_beside(__file__)
ID_BYTES = 32
MAX_ID_LENGTH = 64  # a cookie longer than any id this module makes is no session


class ConsoleSessions:
    """Open, use and close console sessions under one prefix (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        keys: KeyRing,
        *,
        lifetime_s: float,
        idle_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client, self.prefix, self.keys = client, prefix, keys
        self.lifetime_s, self.idle_s, self.clock = lifetime_s, idle_s, clock
        self._touch = SCRIPTS("session_touch.lua")

    def key_of(self, session_id: str) -> str:
        """The Redis key of a session: its id's sha256, so the store holds no usable id."""
        return f"{self.prefix}:console:session:{hashlib.sha256(session_id.encode()).hexdigest()}"

    def open(self, grant: Grant, key: str) -> str:
        """A new session of ``key`` (already verified, whose grant is ``grant``); its id."""
        session_id = secrets.token_urlsafe(ID_BYTES)
        now = self.clock()
        fields: dict[Any, Any] = {  # redis-py types its mapping keys invariantly
            "k": hashlib.sha256(key.encode()).hexdigest(),
            "c": repr(now),
            "s": repr(now),
        }
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.key_of(session_id), mapping=fields)
            pipe.expire(self.key_of(session_id), self._keep_s())
            pipe.execute()
        return session_id

    def grant_of(self, session_id: str) -> Grant | None:
        """The grant of the live session ``session_id``, marking it used; None when there is no
        such session, it lapsed, or its key was revoked (the session is then ended)."""
        if not session_id or len(session_id) > MAX_ID_LENGTH:
            return None
        where = self.key_of(session_id)
        args = (repr(self.clock()), repr(self.idle_s), repr(self.lifetime_s), self._keep_s())
        hashed = self._touch.run(self.client, [where], args)
        if not hashed:
            return None
        grant = self.keys.current(cast(bytes, hashed).decode())
        if grant is None:  # the key was revoked: its session ends with it
            self.client.delete(where)
        return grant

    def close(self, session_id: str) -> None:
        """End the session ``session_id`` (signing out); nothing when there is none."""
        if session_id and len(session_id) <= MAX_ID_LENGTH:
            self.client.delete(self.key_of(session_id))

    def _keep_s(self) -> int:
        return max(1, math.ceil(self.idle_s))
