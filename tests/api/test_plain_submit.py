"""Plain submissions answered ahead of FastAPI (:mod:`api.plain_submit`) get FastAPI's answer:
the same status, headers and body, and every request it does not answer reaches FastAPI with
its body whole."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from api.plain_submit import PlainSubmit
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, Keys

pytestmark = pytest.mark.redis
GOOD = {"agent": AGENT, "goal": "refund the damaged item on order ord_1", "user": "cu_ana"}
# FastAPI reads this as JSON too, but the plain path leaves it to FastAPI: the route's answer
TO_FASTAPI = "application/json; charset=utf-8"


def _blank_id(reply: Any) -> tuple[int, bytes, list[tuple[str, str]]]:
    """A reply's status, body and headers with its trajectory id blanked."""
    tid = reply.json()["trajectory_id"]
    headers = [(k, v.replace(tid, "ID")) for k, v in reply.headers.items()]
    return reply.status_code, reply.content.replace(tid.encode(), b"ID"), headers


def test_a_plain_submission_is_answered_as_the_route_answers_it(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    body = json.dumps(GOOD).encode()
    plain = http.post(
        "/v1/trajectories",
        content=body,
        headers={**keys.auth(keys.acme), "content-type": "application/json"},
    )
    routed = http.post(
        "/v1/trajectories",
        content=body,
        headers={**keys.auth(keys.acme), "content-type": TO_FASTAPI},
    )
    assert plain.status_code == 201, plain.text
    assert _blank_id(plain) == _blank_id(routed)
    store = RedisStore(redis_client, prefix=key_prefix)
    for reply in (plain, routed):
        rec = store.load("acme", reply.json()["trajectory_id"])
        assert (rec.agent, rec.goal, rec.user) == (AGENT, GOOD["goal"], GOOD["user"])
        assert reply.headers["location"] == f"/v1/trajectories/{rec.trajectory_id}"


def test_a_refusal_of_the_submission_is_the_routes_problem(http: TestClient, keys: Keys) -> None:
    """Refused by the router API after every check here passed: the app's handlers answer."""
    job = {**GOOD, "budget": {"max_fun": 3}}
    replies = [
        http.post(
            "/v1/trajectories", content=json.dumps(job), headers={**keys.auth(keys.acme), **h}
        )
        for h in ({"content-type": "application/json"}, {"content-type": TO_FASTAPI})
    ]
    for reply in replies:
        assert reply.status_code == 422, reply.text
        assert reply.headers["content-type"] == "application/problem+json"
        assert reply.json()["field"] == "budget"
    plain, routed = (re.sub(r'"error_id":"[0-9a-f]+"', "", r.text) for r in replies)
    assert plain == routed


class _Inner:
    """The app behind the plain path: what reached it, and the body it could read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _call(http: TestClient, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, _Inner]:
    """Send one POST /v1/trajectories straight to a plain path over an :class:`_Inner`, the body
    in ``chunks``; the status answered and the inner app."""
    inner = _Inner()
    middleware = PlainSubmit(inner)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/trajectories",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "app": http.app,
    }
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], inner


def test_what_the_plain_path_does_not_answer_reaches_fastapi_whole(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    body = json.dumps(GOOD).encode()
    plain = {**keys.auth(keys.acme), "content-type": "application/json", "content-length": "1"}
    status, inner = _call(http, plain, [body[:10], body[10:]])
    assert (status, inner.bodies) == (201, []), "a plain submission is answered here"
    bad_goal = json.dumps({**GOOD, "goal": ""}).encode()
    handed_on = [
        ({**plain, "Authorization": "Bearer rk_00000000_nope"}, body),
        ({**plain, "Authorization": f"Basic {keys.acme}"}, body),
        ({**plain, **keys.auth(keys.acme_read_only)}, body),
        ({**plain, **keys.auth(keys.operator)}, body),
        ({k: v for k, v in plain.items() if k != "Authorization"}, body),
        ({**plain, "Idempotency-Key": "k1"}, body),
        ({**plain, "content-type": TO_FASTAPI}, body),
        ({k: v for k, v in plain.items() if k != "content-length"}, body),
        (plain, b"{not json"),
        (plain, bad_goal),
        (plain, b""),
    ]
    for headers, sent in handed_on:
        status, inner = _call(http, headers, [sent[:5], sent[5:]])
        assert (status, inner.bodies) == (299, [sent]), headers
    assert len(RedisStore(redis_client, prefix=key_prefix).list("acme")) == 1
