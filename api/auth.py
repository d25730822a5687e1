"""Who calls: the API key in ``Authorization: Bearer``, its tenant, principal and scopes.

The tenant and the principal come from the key, never from a body. A missing or unknown key is
a 401; a key without the scope an endpoint needs is a 403 (checked before anything is read, so
it says nothing about any id); a tenant endpoint called with an operator key is a 403 too.
Whoever authenticates a request also leaves how to ask again whether it may go on
(:func:`recheck_of`), which a long answer (an event stream) asks as it goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.front import Front
from api.keys import Grant, Scope, digest
from api.problems import Problem

bearer = HTTPBearer(auto_error=False, description="an API key: reins keys create")


def front_of(request: Request) -> Front:
    """The API's parts, held by the app."""
    front: Front = request.app.state.front
    return front


async def _grant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Grant:
    if credentials is None:
        raise Problem(
            401,
            "Unauthenticated",
            "send an API key as 'Authorization: Bearer <key>' (reins keys create makes one)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    keys = front_of(request).keys
    grant = keys.verify(credentials.credentials)
    hashed = digest(credentials.credentials)
    let_recheck(request, lambda: keys.current(hashed) is not None)
    if grant is None:
        raise Problem(
            401,
            "Unauthenticated",
            "this API key is unknown or revoked; ask the operator for a key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return grant


Authenticated = Annotated[Grant, Depends(_grant)]


def let_recheck(request: Request, still_allowed: Callable[[], bool]) -> None:
    """Record how to ask whether the caller of ``request`` may still go on (blocking I/O)."""
    request.state.recheck = still_allowed


def recheck_of(request: Request) -> Callable[[], bool]:
    """How to ask whether the authenticated caller of ``request`` may still go on: its key (or
    console session) as Redis holds it now, never a remembered answer."""
    still_allowed: Callable[[], bool] = request.state.recheck
    return still_allowed


def need(grant: Grant, scope: Scope) -> str:
    """The caller's tenant, if its key holds ``scope`` for a tenant; a 403 otherwise."""
    if not grant.has(scope):
        raise Problem(
            403,
            "Forbidden",
            f"this API key lacks the {scope.value!r} scope; ask for a key that holds it",
            kind="missing-scope",
        )
    if grant.tenant is None:
        raise Problem(
            403,
            "Forbidden",
            "an operator key names no tenant; use a tenant's key for its trajectories",
            kind="no-tenant",
        )
    return grant.tenant


def need_operator(grant: Grant) -> None:
    """A 403 unless the key holds the operator scope."""
    if not grant.has(Scope.OPERATOR):
        raise Problem(
            403, "Forbidden", "fleet administration needs an operator key", kind="missing-scope"
        )
