"""The HTTP API of a reins fleet (``reins api``): FastAPI over the router's in-process API.

:func:`create_app` builds the application over a :class:`~api.front.Front` (wired from the
settings unless given); nothing connects at import. Routes: :mod:`api.routes` (trajectories,
approvals, usage), :mod:`api.memory_routes` (the tenant's facts and episodes) and
:mod:`api.fleet_routes` (the operator's ring, drain, remove); errors are problem details
(:mod:`api.problems`); the web console at ``/ui`` (:mod:`api.console`). Forwarded headers
are believed only from ``REINS_TRUSTED_PROXIES``. Design: ``docs/adr/0110-api.md``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.staticfiles import StaticFiles
from starlette.responses import JSONResponse
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from api import authority_routes, fleet_routes, memory_routes, problems, routes
from api.auth import front_of
from api.console import pages as console
from api.front import Front
from api.limits import BodyLimit
from api.plain_submit import PlainSubmit
from kernel.settings import Settings


def _not_ready(code: str, why: str, error_id: str) -> JSONResponse:
    return JSONResponse({"ready": False, "code": code, "why": why, "error_id": error_id}, 503)


def create_app(settings: Settings, front: Front | None = None) -> FastAPI:
    """The application; ``front`` replaces the parts wired from ``settings`` (tests)."""
    parts = front if front is not None else Front.wire(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await parts.aclose()

    app = FastAPI(
        title="reins",
        version="1",
        description="Run LLM-agent trajectories under budgets, approvals and fair shares.",
        lifespan=lifespan,
    )
    app.state.front = parts
    app.add_middleware(PlainSubmit)  # inside the body limit and the forwarded headers
    app.add_middleware(BodyLimit)
    if settings.proxies():
        # outermost: X-Forwarded-For and -Proto are believed from these peers only (uvicorn's
        # own trust, of 127.0.0.1 by default, is off: api.serve); from any other, ignored
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.proxies())
    problems.install(app)
    app.include_router(authority_routes.router)  # before routes: /{control} takes any name
    app.include_router(routes.router)
    app.include_router(fleet_routes.router)
    app.include_router(memory_routes.router)
    app.mount("/ui/static", StaticFiles(directory=console.HERE / "static"), name="console-static")
    app.include_router(console.router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, bool]:
        """The process answers."""
        return {"ok": True}

    @app.get("/readyz", tags=["health"], responses={503: {"description": "not ready"}})
    def readyz(request: Request) -> JSONResponse:
        """Redis answers and the fleet's configuration is applied. Not ready: a ``code`` and an
        ``error_id`` (the API's log line of it holds the cause), never the error's text, since
        anyone may ask."""
        front = front_of(request)
        try:
            front.client.ping()
            fleet = front.config.peek()
        except Exception as exc:  # any failure to read Redis means not ready
            problem = problems.logged(request, problems.failed(503, "store_unavailable"), exc)
            return _not_ready(problem.code, "the store's Redis did not answer", problem.error_id)
        if fleet is None:
            why = "no fleet configuration: run reins config apply FILE"
            problem = problems.logged(request, problems.failed(503, "not_configured"))
            return _not_ready(problem.code, why, problem.error_id)
        return JSONResponse({"ready": True, "config_version": fleet.version})

    return app
