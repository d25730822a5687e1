"""What the API shows a reviewer of a held action: when it was held, what dispatching it would
reserve, what it would change (where its tool can say); and the comment a decision keeps."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from kernel.record import TrajectoryRecord
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis


def test_a_held_refund_shows_its_reservation_and_the_change_to_the_order(
    http: TestClient, keys: Keys, acme_held: TrajectoryRecord
) -> None:
    rec = acme_held
    assert rec.held is not None
    order = rec.held.args["order_id"]
    listed = http.get("/v1/approvals", headers=keys.auth(keys.acme)).json()["items"]
    shown = http.get(f"/v1/trajectories/{rec.trajectory_id}", headers=keys.auth(keys.acme))
    for held in (listed[0], shown.json()["held_approval"]):
        assert held["held_at"] == rec.held.held_at > 0
        assert held["reserves"] == {"steps": "0", "tool_calls": "1", "tokens": "0", "dollars": "0"}
        assert held["changes"] == [
            {"name": f"{order}.refunded_cents", "before": 0, "after": 9000},
            {"name": f"{order}.refundable_cents", "before": 12_000, "after": 3000},
        ]


def test_a_decision_keeps_its_comment_in_the_chain_and_a_long_one_is_refused(
    http: TestClient, keys: Keys, acme_held: TrajectoryRecord
) -> None:
    rec, auth = acme_held, keys.auth(keys.acme)
    assert rec.held is not None
    path = f"/v1/trajectories/{rec.trajectory_id}/approvals/{rec.held.approval_id}"
    body = {"decision": "deny", "version": rec.held.held_version, "digest": rec.held.digest}
    long = http.post(path, json={**body, "comment": "x" * 2001}, headers=auth)
    assert long.status_code == 422 and long.json()["field"] == "comment"
    shown = http.get(f"/v1/trajectories/{rec.trajectory_id}", headers=auth)
    assert shown.headers["etag"] == f'"{rec.record_version}"', "a refused decision wrote"

    done = http.post(path, json={**body, "comment": "refunded by phone"}, headers=auth)
    assert done.status_code == 200, done.text
    stream = http.get(f"/v1/trajectories/{rec.trajectory_id}/events?follow=false", headers=auth)
    rows = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: ")]
    denied = [r for r in rows if r["kind"] == "approval" and r["outcome"] == "denied"]
    assert [r["detail"] for r in denied] == [
        {
            "approval_id": rec.held.approval_id,
            "reviewer": "reviewer",
            "comment": "refunded by phone",
        }
    ]
