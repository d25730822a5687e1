"""Errors as RFC 9457 problem details: ``application/problem+json`` with type, title, status,
detail and, where one field is at fault, ``field``.

Handlers turn request validation errors, :class:`Problem` and reins's own errors into such
bodies, so no error leaves as a bare 500 with a traceback: every refusal says what to fix. A
trajectory the caller's tenant does not hold and one that does not exist get the very same
body (:func:`not_found`), so an id of another tenant reveals nothing.
"""

from __future__ import annotations

import logging
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


class Problem(Exception):
    """A refusal with its HTTP status, a short title, what to do, and the field at fault."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        field: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.field = status, title, detail, field
        self.kind = kind or title.lower().replace(" ", "-")
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The problem document."""
        out: dict[str, Any] = {
            "type": f"https://reins.dev/problems/{self.kind}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
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


def from_reins(exc: ReinsError) -> Problem:
    """The problem of one of reins's own errors (the refusal of a request; nothing changed)."""
    if isinstance(exc, SnapshotNotFound):
        return not_found()
    if isinstance(exc, ConfigError):  # the fleet's configuration is missing or unusable
        return Problem(503, "Not configured", str(exc), kind="not-configured")
    if isinstance(exc, StoreUnavailable):
        return Problem(503, "Unavailable", f"the store did not answer: {exc}; retry")
    if exc.code == "backlog_full":  # the tenant's backlog is full: back off, not a bad job
        return Problem(429, "Backlog full", str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, UnknownAgent):
        return Problem(422, "Unknown agent", str(exc), field=exc.field)
    if exc.code == "not_a_reviewer":
        return Problem(403, "Not a reviewer", str(exc), kind="not-a-reviewer")
    if isinstance(exc, StaleDecision | ConcurrentModification):
        return Problem(409, "Conflict", f"{exc}; read the trajectory again and retry")
    if isinstance(exc, IllegalTransition | ControlFlow):
        return Problem(409, "Not now", str(exc), kind="conflict")
    if isinstance(exc, InvalidInput):
        return Problem(422, "Invalid input", str(exc), field=exc.field, kind="invalid-input")
    return Problem(500, "Internal error", f"{type(exc).__name__}: {exc}")


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
    field = ".".join(loc) or None
    detail = f"{field}: {first['msg']}" if field else str(first["msg"])
    return Problem(422, "Invalid request", detail, field=field, kind="invalid-request").response()


def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return exc.response()


def _reins(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ReinsError)
    problem = from_reins(exc)
    if problem.status >= 500:
        log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return problem.response()


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    titles = {404: "Not found", 405: "Method not allowed", 413: "Body too large"}
    title = titles.get(exc.status_code, "HTTP error")
    return Problem(exc.status_code, title, str(exc.detail), kind="http").response()


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=exc)
    return Problem(500, "Internal error", "the API failed; see its log").response()


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(ReinsError, _reins)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _unexpected)
