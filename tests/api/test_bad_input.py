"""Bad input gets a problem that names the field, and changes nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from kernel.record import ApprovalStatus, TrajectoryRecord
from kernel.states import LifecycleState
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, Keys

pytestmark = pytest.mark.redis
GOOD = {"agent": AGENT, "goal": "refund the damaged item on order ord_1", "user": "cu_ana"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tenant": "globex"}, "tenant"),
        ({"colour": "blue"}, "colour"),
        ({"goal": "x" * 20_001}, "goal"),
        ({"goal": ""}, "goal"),
        ({"budget": {"max_steps": -1}}, "budget"),
        ({"budget": {"max_fun": 3}}, "budget"),
        ({"agent": "this:agent"}, "agent"),
        ({"agent": "examples.support_store:agent_lookup"}, "agent"),
        ({"service_class": "gold"}, "service_class"),
    ],
)
def test_a_refused_job_names_its_field_and_creates_nothing(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str, change, field
) -> None:
    imported_before = "this" in sys.modules
    reply = http.post("/v1/trajectories", json={**GOOD, **change}, headers=keys.auth(keys.acme))
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    problem = reply.json()
    assert problem["field"] == field, problem
    assert {"type", "title", "status", "detail"} <= set(problem)
    assert RedisStore(redis_client, prefix=key_prefix).list("acme") == []
    assert ("this" in sys.modules) == imported_before, "a refused agent's module was imported"


def test_malformed_json_is_a_problem(http: TestClient, keys: Keys) -> None:
    headers = {**keys.auth(keys.acme), "content-type": "application/json"}
    reply = http.post("/v1/trajectories", content=b"{not json", headers=headers)
    assert reply.status_code == 422
    assert reply.headers["content-type"] == "application/problem+json"


def test_an_idempotency_key_names_one_trajectory_for_one_body(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    headers = {**keys.auth(keys.acme), "Idempotency-Key": "order-1-refund"}
    first = http.post("/v1/trajectories", json=GOOD, headers=headers)
    again = http.post("/v1/trajectories", json=GOOD, headers=headers)
    assert first.status_code == 201 and again.status_code == 200, (first.text, again.text)
    assert first.json()["trajectory_id"] == again.json()["trajectory_id"]
    assert (again.json()["created"], again.json()["state"]) == (False, "READY")
    other = http.post("/v1/trajectories", json={**GOOD, "goal": "another"}, headers=headers)
    assert other.status_code == 422 and other.json()["field"] == "Idempotency-Key"
    assert RedisStore(redis_client, prefix=key_prefix).list("acme") == [
        first.json()["trajectory_id"]
    ]
    # another tenant's same key is another key
    theirs = {**keys.auth(keys.globex), "Idempotency-Key": "order-1-refund"}
    assert http.post("/v1/trajectories", json=GOOD, headers=theirs).status_code == 201


def test_a_wrong_decision_names_its_field_and_changes_nothing(
    http: TestClient,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    assert rec.held is not None
    held, tid = rec.held, rec.trajectory_id
    path = f"/v1/trajectories/{tid}/approvals/{held.approval_id}"
    right = {"decision": "approve", "version": held.held_version, "digest": held.digest}
    for change, field in (
        ({"version": held.held_version + 1}, "version"),
        ({"digest": "0" * 64}, "digest"),
        ({"decision": "maybe"}, "decision"),
        ({"reviewer": "me"}, "reviewer"),
    ):
        reply = http.post(path, json={**right, **change}, headers=keys.auth(keys.acme))
        assert reply.status_code in (409, 422), reply.text
        assert reply.json()["field"] == field
    store = RedisStore(redis_client, prefix=key_prefix)
    assert store.load("acme", tid).record_version == rec.record_version

    # an approval past its expiry: refused by name, the record left as it was
    expired = store.load("acme", tid)
    assert expired.held is not None
    expired.held.expires_at = 1.0
    expired.record_version += 1
    store.compare_and_set(expired, rec.record_version)
    reply = http.post(
        path, json={**right, "version": held.held_version}, headers=keys.auth(keys.acme)
    )
    assert reply.status_code == 409 and reply.json()["field"] == "approval_id", reply.text
    after = store.load("acme", tid)
    assert after.record_version == expired.record_version
    assert after.state is LifecycleState.AWAITING_APPROVAL
    assert after.held is not None and after.held.status is ApprovalStatus.HELD


def test_an_oversized_body_is_refused_before_it_is_read(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    huge = {**GOOD, "goal": "x" * 300_000}
    declared = http.post("/v1/trajectories", json=huge, headers=keys.auth(keys.acme))
    assert declared.status_code == 413, declared.text
    assert declared.headers["content-type"] == "application/problem+json"

    def chunks():  # no Content-Length: the body is streamed in pieces
        yield b'{"agent": "examples.support_store:agent", "user": "u", "goal": "'
        for _ in range(40):
            yield b"x" * 10_000
        yield b'"}'

    headers = {**keys.auth(keys.acme), "content-type": "application/json"}
    chunked = http.post("/v1/trajectories", content=chunks(), headers=headers)
    assert chunked.status_code == 413, chunked.text
    assert RedisStore(redis_client, prefix=key_prefix).list("acme") == []


def test_a_trajectory_unchanged_since_its_etag_is_a_304(http: TestClient, keys: Keys) -> None:
    auth = keys.auth(keys.acme)
    tid = http.post("/v1/trajectories", json=GOOD, headers=auth).json()["trajectory_id"]
    etag = http.get(f"/v1/trajectories/{tid}", headers=auth).headers["etag"]
    same = http.get(f"/v1/trajectories/{tid}", headers={**auth, "If-None-Match": etag})
    assert same.status_code == 304 and same.content == b""
    http.post(f"/v1/trajectories/{tid}/pause", headers=auth)
    moved = http.get(f"/v1/trajectories/{tid}", headers={**auth, "If-None-Match": etag})
    assert moved.status_code == 200 and moved.headers["etag"] != etag


def test_a_full_backlog_is_a_429_to_retry(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str, fleet_file: Path
) -> None:
    from router.fleet import config as fleet_config

    data = fleet_config.read_file(fleet_file)
    data["tenants"][0]["max_ready"] = 1
    fleet_config.apply(redis_client, key_prefix, data)
    http.app.state.front.config.refresh_s = 0.0  # see the new version at once
    auth = keys.auth(keys.acme)
    assert http.post("/v1/trajectories", json=GOOD, headers=auth).status_code == 201
    full = http.post("/v1/trajectories", json=GOOD, headers=auth)
    assert full.status_code == 429 and full.headers["retry-after"] == "5", full.text
    assert len(RedisStore(redis_client, prefix=key_prefix).list("acme")) == 1


def test_without_a_fleet_configuration_the_api_is_not_ready_and_says_what_to_run(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    redis_client.delete(f"{key_prefix}:fleet:config")
    front = http.app.state.front
    front.config.refresh_s = 0.0
    assert http.get("/readyz").status_code == 503
    reply = http.post("/v1/trajectories", json=GOOD, headers=keys.auth(keys.acme))
    assert reply.status_code == 503 and "reins config apply" in reply.json()["detail"]
