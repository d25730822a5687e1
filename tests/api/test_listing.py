"""Listings page through the tenant's trajectories and filter by state; a decision is the key's
principal's, refused (changing nothing) when that principal is not among the agent's reviewers;
the async client speaks the same API."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redis
from fastapi.testclient import TestClient

from api.client import ApiError, AsyncReinsClient
from api.keys import KeyRing, Scope
from kernel.record import TrajectoryRecord
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, Keys

pytestmark = pytest.mark.redis
JOB = {"agent": AGENT, "goal": "refund the damaged item on order ord_1", "user": "cu_ana"}


def test_pages_cover_every_trajectory_once_and_the_state_filter_holds(
    http: TestClient, keys: Keys
) -> None:
    auth = keys.auth(keys.acme)
    made = {http.post("/v1/trajectories", json=JOB, headers=auth).json()["trajectory_id"]}
    made |= {http.post("/v1/trajectories", json=JOB, headers=auth).json()["trajectory_id"]}
    made |= {http.post("/v1/trajectories", json=JOB, headers=auth).json()["trajectory_id"]}
    paused = sorted(made)[0]
    assert http.post(f"/v1/trajectories/{paused}/pause", headers=auth).status_code == 200

    seen: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/trajectories", params=params, headers=auth).json()
        seen += [t["trajectory_id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(made)
    ready = http.get("/v1/trajectories?state=READY", headers=auth).json()["items"]
    assert {t["trajectory_id"] for t in ready} == made - {paused}
    only = http.get("/v1/trajectories?state=PAUSED", headers=auth).json()["items"]
    assert [t["trajectory_id"] for t in only] == [paused]
    bad = http.get("/v1/trajectories?state=SLEEPING", headers=auth)
    assert bad.status_code == 422 and bad.json()["field"] == "state"


def test_a_principal_who_is_not_a_reviewer_cannot_decide(
    http: TestClient,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    assert rec.held is not None
    intern = KeyRing(redis_client, key_prefix).create("acme", "intern", {Scope.DECIDE})[0]
    path = f"/v1/trajectories/{rec.trajectory_id}/approvals/{rec.held.approval_id}"
    body = {"decision": "approve", "version": rec.held.held_version, "digest": rec.held.digest}
    reply = http.post(path, json=body, headers=keys.auth(intern))
    assert reply.status_code == 403 and "intern" in reply.json()["detail"], reply.text
    after = RedisStore(redis_client, prefix=key_prefix).load("acme", rec.trajectory_id)
    assert after.record_version == rec.record_version

    denied = http.post(path, json={**body, "decision": "deny"}, headers=keys.auth(keys.acme))
    assert denied.status_code == 200, denied.text
    assert denied.json()["detail"] == {"decision": "deny", "reviewer": "reviewer"}


def test_the_async_client_submits_shows_and_is_refused_by_name(
    http: TestClient, keys: Keys
) -> None:
    async def scenario() -> tuple[dict, ApiError]:
        client = AsyncReinsClient(
            "http://api", keys.acme, transport=httpx.ASGITransport(app=http.app)
        )
        try:
            done = await client.submit(JOB)
            shown = await client.show(done["trajectory_id"])
            try:
                await client.submit({**JOB, "agent": "this:agent"})
            except ApiError as exc:
                return shown, exc
            raise AssertionError("an unlisted agent was accepted")
        finally:
            await client.aclose()

    shown, refused = asyncio.run(scenario())
    assert shown["state"] == "READY"
    assert refused.status == 422 and refused.problem["field"] == "agent"
