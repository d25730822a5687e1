"""Who is signed in to the console: the API key, kept in an HttpOnly cookie.

Signing in posts the key once; the API verifies it as it verifies a bearer key, and only a key
it knows is stored, in a cookie scripts cannot read (``HttpOnly``), sent only to ``/ui`` and
only by pages of this origin (``SameSite=Strict``; ``Secure`` over HTTPS). Every request checks
the key again, so a revoked key stops working within the API's memory of keys (5 s). A form
posted from another origin is refused before anything is read (:func:`same_origin`).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from starlette.responses import Response

from api.auth import front_of, let_recheck
from api.keys import Grant, digest
from api.problems import Problem

COOKIE = "reins_console_key"
PATH = "/ui"
MAX_KEY_LENGTH = 200


class SignInNeeded(Exception):
    """No key, or one the API no longer knows: the console asks for one."""


def grant_of(request: Request) -> Grant:
    """The grant of the key signed in; :class:`SignInNeeded` when there is none."""
    key = request.cookies.get(COOKIE)
    if not key or len(key) > MAX_KEY_LENGTH:
        raise SignInNeeded
    keys = front_of(request).keys
    grant = keys.verify(key)
    if grant is None:
        raise SignInNeeded
    hashed = digest(key)
    let_recheck(request, lambda: keys.current(hashed) is not None)
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


def keep(response: Response, request: Request, key: str) -> None:
    """Store the verified ``key`` in the console's cookie (for this browser session)."""
    response.set_cookie(
        COOKIE,
        key.strip(),
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def forget(response: Response) -> None:
    """Sign out: the cookie is cleared."""
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")


def origin_of(url: str) -> str | None:
    """The origin of ``url`` as a browser writes it (``scheme://host[:port]``, lower case, no
    default port); None when it has none (not http or https, or no host)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def same_origin(request: Request) -> None:
    """A 403 for a form posted by a page of another origin (cross-site request forgery):
    ``Sec-Fetch-Site: cross-site``, an ``Origin`` not the console's, or, when a browser sent
    no ``Origin``, a ``Referer`` of another origin. A request with neither header is no
    browser's form (the cookie is ``SameSite=Strict`` besides)."""
    mine = origin_of(str(request.url))
    origin = request.headers.get("origin")
    referer = request.headers.get("referer")
    if (
        request.headers.get("sec-fetch-site") == "cross-site"
        or (origin is not None and origin_of(origin) != mine)
        or (origin is None and referer is not None and origin_of(referer) != mine)
    ):
        raise Problem(403, "Forbidden", "a console form must be sent from the console's own pages")


SignedIn = Annotated[Grant, Depends(grant_of)]
