"""Who is signed in to the console: a server-side session (:mod:`api.console.sessions`) whose
random id is kept in an HttpOnly cookie.

Signing in posts the key once; the API verifies it as it verifies a bearer key and opens a
session for it. The cookie holds only the session's id, never the key: scripts cannot read it
(``HttpOnly``), it goes only to ``/ui`` and only from pages of this site (``SameSite=Strict``),
only over HTTPS whenever the console is reached over HTTPS (``Secure``: the public URL is
https, :mod:`api.console.origin`), and the browser drops it at the session's lifetime. Every
request checks the session and the key in Redis as they are now, so signing out or revoking
the key ends the session at its next request, and a stream open under it within
``REINS_API_KEY_CACHE_S``. The cookie of the console before sessions (the raw key) is cleared
whenever a session is opened or closed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.responses import Response

from api.auth import front_of, let_recheck
from api.console.origin import over_https
from api.keys import Grant
from api.problems import Problem

COOKIE = "reins_console_session"
OLD_COOKIE = "reins_console_key"  # 0.2.0 and before: the raw key
PATH = "/ui"
MAX_KEY_LENGTH = 200


class SignInNeeded(Exception):
    """No session, or one that lapsed or whose key was revoked: the console asks for a key."""


def grant_of(request: Request) -> Grant:
    """The grant of the session signed in; :class:`SignInNeeded` when there is none."""
    session_id = request.cookies.get(COOKIE, "")
    sessions = front_of(request).sessions
    grant = sessions.grant_of(session_id)
    if grant is None:
        raise SignInNeeded
    let_recheck(request, lambda: sessions.grant_of(session_id) is not None)
    return grant


def verify(request: Request, key: str) -> Grant:
    """The grant of ``key`` as typed at sign-in; a 401 problem naming the field if unknown."""
    key = key.strip()
    if not key or len(key) > MAX_KEY_LENGTH:
        raise Problem(401, "Unauthenticated", "paste an API key (rk_...)", field="key")
    grant = front_of(request).keys.verify(key)
    if grant is None:
        raise Problem(
            401,
            "Unauthenticated",
            "this API key is unknown or revoked; ask the operator for a key",
            field="key",
        )
    return grant


def keep(response: Response, request: Request, grant: Grant, key: str) -> None:
    """Open a session for the verified ``key`` and give its id to the browser; a session
    this browser held before is ended (a new id at every sign-in)."""
    front = front_of(request)
    front.sessions.close(request.cookies.get(COOKIE, ""))
    session_id = front.sessions.open(grant, key.strip())
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=int(front.settings.console_session_s),
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=over_https(request),
    )
    _clear_old(response)


def forget(response: Response, request: Request) -> None:
    """Sign out: the session ends in Redis and the cookie is cleared."""
    front_of(request).sessions.close(request.cookies.get(COOKIE, ""))
    secure = over_https(request)
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict", secure=secure)
    _clear_old(response)


def _clear_old(response: Response) -> None:
    response.delete_cookie(OLD_COOKIE, path=PATH, httponly=True, samesite="strict")


SignedIn = Annotated[Grant, Depends(grant_of)]
