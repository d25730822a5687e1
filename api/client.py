"""A typed Python client of the reins API, on httpx: :class:`ReinsClient` (sync) and
:class:`AsyncReinsClient`.

Each method is one request and returns the response's JSON (a dict or a list) or, for
:meth:`ReinsClient.events`, the Server-Sent Events as :class:`Event` objects until the run stops.
A refusal raises :class:`ApiError` carrying the problem document (status, title, detail, field).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote

import httpx

from kernel.errors import ReinsError

JsonDict = dict[str, Any]


class ApiError(ReinsError):
    """The API refused a request; ``problem`` is its RFC 9457 document."""

    def __init__(self, status: int, problem: JsonDict) -> None:
        self.status, self.problem = status, problem
        field = problem.get("field")
        where = f" ({field})" if field else ""
        detail = problem.get("detail") or problem.get("title") or "refused"
        super().__init__(f"{status} {problem.get('title', '')}{where}: {detail}")


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a trajectory's stream: its chain index, kind and row."""

    id: int
    kind: str
    data: JsonDict


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:500]}
    raise ApiError(response.status_code, problem if isinstance(problem, dict) else {})


def _json(response: httpx.Response) -> Any:
    _raise_for(response)
    return response.json()


class SseParser:
    """Server-Sent Events from lines (only ``id``, ``event`` and ``data``; comments ignored)."""

    def __init__(self) -> None:
        self.fields: dict[str, str] = {}

    def feed(self, line: str) -> Event | None:
        """Take one line; the event it completes, if any."""
        if line == "":
            fields, self.fields = self.fields, {}
            if "data" not in fields:
                return None
            return Event(
                int(fields.get("id", "-1")),
                fields.get("event", "message"),
                json.loads(fields["data"]),
            )
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        self.fields[name] = value[1:] if value.startswith(" ") else value
        return None


def _decision(approve: bool, version: int, digest: str) -> JsonDict:
    return {"decision": "approve" if approve else "deny", "version": version, "digest": digest}


class ReinsClient:
    """The API over one connection pool; ``base_url`` like ``http://127.0.0.1:8080``
    (``transport``: another httpx transport, such as an ASGI app in process)."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> ReinsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, job: JsonDict, *, idempotency_key: str | None = None) -> JsonDict:
        """Create a trajectory: ``{"agent", "goal", "user", "budget"?, "service_class"?}``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return cast(JsonDict, _json(self.http.post("/v1/trajectories", json=job, headers=headers)))

    def trajectories(
        self, state: str | None = None, limit: int = 50, cursor: str | None = None
    ) -> JsonDict:
        """A page of the tenant's trajectories."""
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if cursor:
            params["cursor"] = cursor
        return cast(JsonDict, _json(self.http.get("/v1/trajectories", params=params)))

    def show(self, trajectory_id: str) -> JsonDict:
        """One trajectory."""
        return cast(JsonDict, _json(self.http.get(f"/v1/trajectories/{trajectory_id}")))

    def trace(self, trajectory_id: str) -> JsonDict:
        """Its span tree and post-mortem."""
        return cast(JsonDict, _json(self.http.get(f"/v1/trajectories/{trajectory_id}/trace")))

    def events(
        self, trajectory_id: str, *, last_event_id: int | None = None, follow: bool = True
    ) -> Iterator[Event]:
        """Its events after ``last_event_id`` until the run stops (without ``follow``: those
        written so far)."""
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        path = f"/v1/trajectories/{trajectory_id}/events"
        params = {"follow": "true" if follow else "false"}
        with self.http.stream(
            "GET", path, headers=headers, params=params, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for(response)
            parser = SseParser()
            for line in response.iter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event

    def control(self, trajectory_id: str, kind: str, instructions: str | None = None) -> JsonDict:
        """pause, resume, cancel, kill or interrupt."""
        body = {"instructions": instructions} if instructions else None
        path = f"/v1/trajectories/{trajectory_id}/{kind}"
        return cast(JsonDict, _json(self.http.post(path, json=body)))

    def freeze(self, trajectory_id: str, *, frozen: bool = True) -> JsonDict:
        """Freeze a trajectory (its writes are held, not sent), or lift its freeze."""
        path = f"/v1/trajectories/{trajectory_id}/freeze"
        return cast(JsonDict, _json(self.http.post(path, json={"frozen": frozen})))

    def grants(self, trajectory_id: str, grants: JsonDict) -> JsonDict:
        """Set a trajectory's grants (tools, read_only, denied_targets)."""
        path = f"/v1/trajectories/{trajectory_id}/grants"
        return cast(JsonDict, _json(self.http.post(path, json=grants)))

    def approvals(self) -> JsonDict:
        """Every approval held in the tenant."""
        return cast(JsonDict, _json(self.http.get("/v1/approvals")))

    def decide(
        self, trajectory_id: str, approval_id: str, *, approve: bool, version: int, digest: str
    ) -> JsonDict:
        """Approve or deny exactly the held action shown (its version and digest)."""
        path = f"/v1/trajectories/{trajectory_id}/approvals/{approval_id}"
        return cast(JsonDict, _json(self.http.post(path, json=_decision(approve, version, digest))))

    def usage(self) -> list[JsonDict]:
        """The tenant's usage (every tenant's, for an operator key)."""
        return cast(list[JsonDict], _json(self.http.get("/v1/usage")))

    def memory(self, kind: str | None = None, user: str | None = None) -> JsonDict:
        """The tenant's facts and episodes (of ``kind``; that concern ``user``)."""
        params = {k: v for k, v in (("kind", kind), ("user", user)) if v}
        return cast(JsonDict, _json(self.http.get("/v1/memory", params=params)))

    def forget(self, item_id: str) -> None:
        """Delete one fact or episode of the tenant."""
        _raise_for(self.http.delete(f"/v1/memory/items/{item_id}"))

    def erase_user(self, user: str) -> JsonDict:
        """Delete every fact and episode that concerns ``user`` (an erasure request); what
        was deleted."""
        return cast(JsonDict, _json(self.http.delete(f"/v1/memory/users/{quote(user, safe='')}")))

    def export_user(self, user: str) -> JsonDict:
        """Everything the tenant's memory holds about ``user``."""
        path = f"/v1/memory/users/{quote(user, safe='')}/export"
        return cast(JsonDict, _json(self.http.get(path)))

    def erase_source(self, call_id: str) -> JsonDict:
        """Delete every fact the result of tool call ``call_id`` shaped; what was deleted."""
        path = f"/v1/memory/sources/{quote(call_id, safe='/')}"
        return cast(JsonDict, _json(self.http.delete(path)))

    def ring(self) -> JsonDict:
        """The ring (operator keys)."""
        return cast(JsonDict, _json(self.http.get("/v1/fleet/ring")))

    def drain(self, name: str) -> JsonDict:
        """Drain a worker (operator keys)."""
        return cast(JsonDict, _json(self.http.post(f"/v1/fleet/workers/{name}/drain")))

    def remove(self, name: str, *, force: bool = False) -> JsonDict:
        """Remove a worker (operator keys)."""
        path = f"/v1/fleet/workers/{name}/remove"
        return cast(JsonDict, _json(self.http.post(path, params={"force": force})))


class AsyncReinsClient:
    """The same API for asyncio callers (the methods a service needs most)."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=timeout_s,
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def submit(self, job: JsonDict, *, idempotency_key: str | None = None) -> JsonDict:
        """Create a trajectory."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        reply = await self.http.post("/v1/trajectories", json=job, headers=headers)
        return cast(JsonDict, _json(reply))

    async def show(self, trajectory_id: str) -> JsonDict:
        """One trajectory."""
        return cast(JsonDict, _json(await self.http.get(f"/v1/trajectories/{trajectory_id}")))

    async def control(self, trajectory_id: str, kind: str) -> JsonDict:
        """pause, resume, cancel, kill or interrupt."""
        reply = await self.http.post(f"/v1/trajectories/{trajectory_id}/{kind}")
        return cast(JsonDict, _json(reply))

    async def decide(
        self, trajectory_id: str, approval_id: str, *, approve: bool, version: int, digest: str
    ) -> JsonDict:
        """Approve or deny exactly the held action shown."""
        path = f"/v1/trajectories/{trajectory_id}/approvals/{approval_id}"
        reply = await self.http.post(path, json=_decision(approve, version, digest))
        return cast(JsonDict, _json(reply))

    async def events(
        self, trajectory_id: str, *, last_event_id: int | None = None
    ) -> AsyncIterator[Event]:
        """Its events after ``last_event_id`` until the run stops."""
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        path = f"/v1/trajectories/{trajectory_id}/events"
        async with self.http.stream("GET", path, headers=headers, timeout=None) as response:
            if response.status_code >= 400:
                await response.aread()
                _raise_for(response)
            parser = SseParser()
            async for line in response.aiter_lines():
                event = parser.feed(line)
                if event is not None:
                    yield event
