"""A bound on request bodies: anything larger than :data:`MAX_BODY` is refused with a 413
problem, by its ``Content-Length`` before it is read, or as soon as a chunked body passes it."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from api.problems import Problem

MAX_BODY = 256 * 1024  # the largest job (a 20,000-character goal) is far below this
TOO_LARGE = f"a request body may hold at most {MAX_BODY:,} bytes"


class BodyLimit:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY:
            problem = Problem(413, "Body too large", TOO_LARGE, kind="body-too-large")
            await problem.response()(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:  # the handler reading the body answers with the problem
                raise HTTPException(413, TOO_LARGE)
            return message

        await self.app(scope, bounded, send)
