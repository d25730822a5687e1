"""Errors as RFC 9457 problem details: ``application/problem+json`` with type, title, status,
detail, a ``code`` callers map, an ``error_id`` and, where one field is at fault, ``field``.

Handlers turn request validation errors, :class:`Problem` and reins's own errors into such
bodies, so no error leaves as a bare 500 with a traceback: every refusal says what to fix. The
``error_id`` is in the API's log line of the same error (:func:`logged`), with the exception
for a failure; a failure's body says only that it failed (its code and id), never the
exception's text, which may name servers and addresses. A trajectory the caller's tenant does
not hold and one that does not exist get the very same body (:func:`not_found`), apart from
its ``error_id``, so an id of another tenant reveals nothing.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from kernel.errors import (
    ConcurrentModification,
    ConfigError,
    ControlFlow,
    IllegalTransition,
    InvalidInput,
    ReinsError,
    SnapshotNotFound,
    StaleDecision,
    StoreUnavailable,
    UnknownAgent,
)

MEDIA = "application/problem+json"
log = logging.getLogger("reins.api")


def error_id() -> str:
    """A new id of one error, to find its line in the API's log (64 random bits, hex)."""
    return secrets.token_hex(8)


class Problem(Exception):
    """A refusal with its HTTP status, a short title, what to do, the field at fault, a
    ``code`` (the reins error's, or the ``kind`` in snake case) and an ``error_id``."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        field: str | None = None,
        kind: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.field = status, title, detail, field
        self.kind = kind or title.lower().replace(" ", "-")
        self.code = code or self.kind.replace("-", "_")
        self.error_id = error_id()
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The problem document."""
        out: dict[str, Any] = {
            "type": f"https://reins.dev/problems/{self.kind}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            "error_id": self.error_id,
        }
        if self.field is not None:
            out["field"] = self.field
        return out

    def response(self) -> JSONResponse:
        """The problem as a response."""
        return JSONResponse(self.body(), self.status, headers=self.headers, media_type=MEDIA)


def not_found(what: str = "trajectory") -> Problem:
    """The one body of "no such thing in your tenant", whether it exists elsewhere or not."""
    return Problem(404, "Not found", f"no such {what} in your tenant", kind="not-found")


def failed(status: int = 500, code: str = "internal", retry: bool = False) -> Problem:
    """The problem of a failure (not a refusal): its code and id, never the exception's text."""
    then = "retry" if retry else "give its error id to the operator, whose log has the cause"
    title = "Unavailable" if status == 503 else "Internal error"
    return Problem(status, title, f"the API could not answer: {then}", kind="failed", code=code)


def from_reins(exc: ReinsError) -> Problem:
    """The problem of one of reins's own errors: a refusal (nothing changed), with reins's own
    words; or a failure (5xx), with its code and id alone."""
    if isinstance(exc, SnapshotNotFound):
        return not_found()
    if isinstance(exc, ConfigError):  # the fleet's configuration is missing or unusable
        problem = failed(503, exc.code, retry=True)
        problem.detail = (
            "the fleet's configuration is missing or unusable: an operator applies one with "
            "reins config apply FILE"
        )
        return problem
    if isinstance(exc, StoreUnavailable):
        return failed(503, exc.code, retry=True)
    if exc.code == "backlog_full":  # the tenant's backlog is full: back off, not a bad job
        return Problem(429, "Backlog full", str(exc), code=exc.code, headers={"Retry-After": "5"})
    if isinstance(exc, UnknownAgent):
        return Problem(422, "Unknown agent", str(exc), field=exc.field, code=exc.code)
    if exc.code == "not_a_reviewer":
        return Problem(403, "Not a reviewer", str(exc), kind="not-a-reviewer")
    if isinstance(exc, StaleDecision | ConcurrentModification):
        detail = f"{exc}; read the trajectory again and retry"
        return Problem(409, "Conflict", detail, code=exc.code)
    if isinstance(exc, IllegalTransition | ControlFlow):
        return Problem(409, "Not now", str(exc), kind="conflict", code=exc.code)
    if isinstance(exc, InvalidInput):
        return Problem(
            422, "Invalid input", str(exc), field=exc.field, kind="invalid-input", code=exc.code
        )
    return failed(500, exc.code)


def logged(request: Request, problem: Problem, exc: BaseException | None = None) -> Problem:
    """Write ``problem``'s line in the API's log, with its ``error_id``: a failure (5xx) as an
    error with ``exc`` and its traceback, a refusal as information; ``problem`` itself."""
    what = (
        request.method,
        request.url.path,
        request.client.host if request.client else "-",  # a trusted proxy's client: api.app
        problem.status,
        problem.code,
        problem.error_id,
    )
    if problem.status >= 500:
        log.error("%s %s from %s failed %d %s [error_id=%s]", *what, exc_info=exc)
    else:
        log.info("%s %s from %s refused %d %s [error_id=%s]", *what)
    return problem


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    field = ".".join(loc) or None
    detail = f"{field}: {first['msg']}" if field else str(first["msg"])
    problem = Problem(422, "Invalid request", detail, field=field, kind="invalid-request")
    return logged(request, problem).response()


def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return logged(request, exc, exc).response()


def _reins(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ReinsError)
    return logged(request, from_reins(exc), exc).response()


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    titles = {404: "Not found", 405: "Method not allowed", 413: "Body too large"}
    title = titles.get(exc.status_code, "HTTP error")
    problem = Problem(exc.status_code, title, str(exc.detail), kind="http")
    return logged(request, problem).response()


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return logged(request, failed(), exc).response()


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(ReinsError, _reins)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
