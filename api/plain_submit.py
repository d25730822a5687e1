"""Plain submissions answered ahead of FastAPI's routing: ``POST /v1/trajectories`` with a JSON
body of ``Content-Length`` bytes, a bearer key and no ``Idempotency-Key``.

Such a request gets what :func:`api.routes.submit` answers, byte for byte apart from the new id,
through the same checks in the same words: the key is verified by the same
:class:`~api.keys.KeyRing`, the body parsed by :func:`json.loads` and validated by the same
:class:`~api.views.JobRequest`, the job submitted by :meth:`api.front.Front.submit`, and a
refusal of the submission answered by the app's own exception handlers. Any request the checks
do not pass before anything is written (no key or an unknown one, a missing scope, a body that
does not parse or validate) goes on to FastAPI untouched, its body replayed, so its error is
FastAPI's own. FastAPI's dependency solving, routing and response validation cost a plain
submission about as much CPU as the router's own work: ``reins bench api``.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.front import Front
from api.keys import Grant
from api.keys import Scope as KeyScope
from api.problems import from_reins
from api.views import JobRequest, Submitted
from kernel.errors import InvalidInput
from kernel.states import LifecycleState

PATH = "/v1/trajectories"
JSON = b"application/json"
_WATCHED = frozenset(
    (b"authorization", b"content-type", b"content-length", b"idempotency-key", b"transfer-encoding")
)


class PlainSubmit:
    """ASGI middleware: see the module docstring. Sits inside the app's body limit and
    forwarded-header middleware, so both hold for the requests it answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH:
            await self.app(scope, receive, send)
            return
        token = _plain_key(scope["headers"])
        if token is None:
            await self.app(scope, receive, send)
            return
        read = await _read_body(receive)
        body = b"".join(m.get("body", b"") for m in read.messages)
        front: Front = scope["app"].state.front
        grant = None if read.error is not None or read.cut else front.keys.verify(token)
        tenant = None if grant is None else _tenant(grant)
        job = None if tenant is None else _job(body)
        if tenant is None or job is None:
            await self.app(scope, read.replay(receive), send)
            return
        await _submit(scope, read.replay(receive), send, front, tenant, job)


def _plain_key(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The bearer key of a request this path answers, or None: one ``Authorization``, read as
    :class:`fastapi.security.HTTPBearer` reads it, one JSON ``Content-Type``, one
    ``Content-Length``, and no ``Idempotency-Key`` (those go to FastAPI)."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        if name in _WATCHED:
            if name in found:  # twice: whichever FastAPI reads, let it
                return None
            found[name] = value
    authorization = found.get(b"authorization")
    if (
        authorization is None
        or found.get(b"content-type") != JSON
        or b"content-length" not in found
        or b"idempotency-key" in found
        or b"transfer-encoding" in found
    ):
        return None
    scheme, credentials = get_authorization_scheme_param(authorization.decode("latin-1"))
    if not scheme or not credentials or scheme.lower() != "bearer":
        return None
    return credentials


def _tenant(grant: Grant) -> str | None:
    """The tenant of a key that may submit (what :func:`api.auth.need` lets through)."""
    return grant.tenant if grant.has(KeyScope.SUBMIT) else None


def _job(body: bytes) -> dict[str, Any] | None:
    """The job as :func:`api.routes.submit` hands it on, or None when FastAPI would refuse it."""
    if not body:
        return None
    try:
        return JobRequest.model_validate(json.loads(body)).model_dump(exclude_none=True)
    except (ValueError, ValidationError):  # JSONDecodeError and UnicodeDecodeError too
        return None


class _Read:
    """The messages of a request body as received, and how it ended."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.error: BaseException | None = None  # raised by receive (the body limit's 413)
        self.cut = False  # the client went away before the body's end

    def replay(self, receive: Receive) -> Receive:
        """A receive that gives the messages read again, then raises what receive raised,
        then goes on receiving."""
        pending = list(self.messages)
        error = self.error

        async def replayed() -> Message:
            nonlocal error
            if pending:
                return pending.pop(0)
            if error is not None:
                raised, error = error, None
                raise raised
            return await receive()

        return replayed


async def _read_body(receive: Receive) -> _Read:
    read = _Read()
    try:
        while True:
            message = await receive()
            read.messages.append(message)
            if message["type"] != "http.request":
                read.cut = True
                return read
            if not message.get("more_body", False):
                return read
    except Exception as exc:  # handed on unchanged to whoever reads the body next
        read.error = exc
        return read


async def _submit(
    scope: Scope, receive: Receive, send: Send, front: Front, tenant: str, job: dict[str, Any]
) -> None:
    """Submit ``job`` for ``tenant``: the 201 of :func:`api.routes.submit`, or a refusal as
    the app's exception handlers answer it."""
    try:
        done, _ = front.submit(tenant, job, None)
    except Exception as exc:
        refusal = from_reins(exc) if isinstance(exc, InvalidInput) else exc
        await _handled(scope, receive, send, refusal)
        return
    answer = Submitted(
        trajectory_id=done.trajectory_id,
        version=done.version,
        state=LifecycleState.READY.value,
        created=True,
    )
    content = answer.model_dump_json().encode()
    headers = [
        (b"content-length", str(len(content)).encode()),
        (b"content-type", JSON),
        (b"location", f"{PATH}/{done.trajectory_id}".encode()),
    ]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": content})


async def _handled(scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
    """Answer ``exc`` as the route's raising it is answered: by the app's handler for the
    nearest class in its MRO; an exception only the catch-all handles is raised on, to the
    server-error middleware that answers it and to the server that logs it."""
    handlers = scope["app"].exception_handlers
    handler = next((handlers[c] for c in type(exc).__mro__ if c in handlers), None)
    if handler is None or handler is handlers.get(Exception):
        raise exc
    response = handler(Request(scope, receive), exc)
    if inspect.isawaitable(response):
        response = await response
    await response(scope, receive, send)
