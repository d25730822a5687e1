"""Tenant isolation through the API: another tenant's ids are exactly as absent as ids that
exist nowhere, listings show only the caller's tenant, and scopes gate what a key may do."""

from __future__ import annotations

import uuid

import pytest
import redis
from fastapi.testclient import TestClient

from kernel.record import TrajectoryRecord
from store.redis_store import RedisStore
from tests.api.conftest import Keys, without_error_id

pytestmark = pytest.mark.redis


def _requests(tid: str, approval_id: str, version: int, digest: str) -> list[tuple[str, str, dict]]:
    """Every endpoint that takes an id: (method, path, json body)."""
    decision = {"decision": "approve", "version": version, "digest": digest}
    out: list[tuple[str, str, dict]] = [
        ("GET", f"/v1/trajectories/{tid}", {}),
        ("GET", f"/v1/trajectories/{tid}/events", {}),
        ("GET", f"/v1/trajectories/{tid}/trace", {}),
        ("POST", f"/v1/trajectories/{tid}/approvals/{approval_id}", decision),
    ]
    for control in ("pause", "resume", "cancel", "kill", "interrupt"):
        out.append(("POST", f"/v1/trajectories/{tid}/{control}", {}))
    return out


def test_another_tenants_ids_get_the_same_404_as_ids_that_do_not_exist(
    http: TestClient,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    assert rec.held is not None
    held = rec.held
    nowhere = f"traj-{uuid.uuid4().hex[:16]}"
    theirs = _requests(rec.trajectory_id, held.approval_id, held.held_version, held.digest)
    absent = _requests(nowhere, held.approval_id, held.held_version, held.digest)
    for (method, path, body), (_, absent_path, _) in zip(theirs, absent, strict=True):
        kwargs = {"json": body} if method == "POST" else {}
        seen = http.request(method, path, headers=keys.auth(keys.globex), **kwargs)
        missing = http.request(method, absent_path, headers=keys.auth(keys.globex), **kwargs)
        assert seen.status_code == 404, (path, seen.status_code, seen.text)
        assert seen.headers["content-type"] == "application/problem+json"
        assert seen.json()["type"].endswith("/not-found"), (path, seen.text)
        # byte for byte, but for the error_id, which is new for every error (its log line's)
        assert without_error_id(seen.content) == without_error_id(missing.content), path

    after = RedisStore(redis_client, prefix=key_prefix).load("acme", rec.trajectory_id)
    assert after.record_version == rec.record_version, "a refused request changed the record"
    assert after.held is not None and after.held.status.value == "held"

    own = http.get(f"/v1/trajectories/{rec.trajectory_id}", headers=keys.auth(keys.acme))
    assert own.status_code == 200 and own.headers["etag"] == f'"{rec.record_version}"'
    shown = own.json()["held_approval"]
    assert (shown["approval_id"], shown["version"], shown["digest"]) == (
        held.approval_id,
        held.held_version,
        held.digest,
    )


def test_listings_never_show_another_tenants_ids(
    http: TestClient,
    keys: Keys,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    body = {"agent": "examples.support_store:agent", "goal": "refund ord_1", "user": "u"}
    mine = http.post("/v1/trajectories", json=body, headers=keys.auth(keys.globex)).json()

    def ids(key: str, path: str) -> set[str]:
        reply = http.get(path, headers=keys.auth(key))
        assert reply.status_code == 200, reply.text
        return {item["trajectory_id"] for item in reply.json()["items"]}

    assert ids(keys.globex, "/v1/trajectories") == {mine["trajectory_id"]}
    assert ids(keys.globex, "/v1/trajectories?state=AWAITING_APPROVAL") == set()
    assert ids(keys.globex, "/v1/approvals") == set()
    assert ids(keys.acme, "/v1/trajectories") == {rec.trajectory_id}
    assert ids(keys.acme, "/v1/approvals") == {rec.trajectory_id}


def test_a_missing_scope_on_ones_own_trajectory_is_a_403_that_changes_nothing(
    http: TestClient,
    keys: Keys,
    redis_client: redis.Redis,
    key_prefix: str,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    assert rec.held is not None
    auditor = keys.auth(keys.acme_read_only)
    tid = rec.trajectory_id
    decision = {"decision": "approve", "version": rec.held.held_version, "digest": rec.held.digest}
    for path, body in (
        (f"/v1/trajectories/{tid}/pause", {}),
        (f"/v1/trajectories/{tid}/approvals/{rec.held.approval_id}", decision),
        ("/v1/trajectories", {"agent": "examples.support_store:agent", "goal": "g", "user": "u"}),
    ):
        reply = http.post(path, json=body, headers=auditor)
        assert reply.status_code == 403, (path, reply.text)
        assert reply.json()["type"].endswith("missing-scope")
    assert http.get(f"/v1/trajectories/{tid}", headers=auditor).status_code == 200
    after = RedisStore(redis_client, prefix=key_prefix).load("acme", tid)
    assert after.record_version == rec.record_version
    assert http.get("/v1/fleet/ring", headers=keys.auth(keys.acme)).status_code == 403
    assert http.get("/v1/fleet/ring", headers=keys.auth(keys.operator)).status_code == 200
    assert http.get("/v1/trajectories", headers=keys.auth(keys.operator)).status_code == 403
    assert http.get("/v1/trajectories").status_code == 401
    bad = {"Authorization": "Bearer rk_00000000_nope"}
    assert http.get("/v1/trajectories", headers=bad).status_code == 401
