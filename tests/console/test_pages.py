"""The console's pages in process over the real Redis: signing in, refusals shown with their
reasons and changing nothing, filters, scopes. (The browser test runs the whole path.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api.keys import KeyRing, Scope
from kernel.chain import RowKind
from kernel.record import ApprovalStatus, TrajectoryRecord
from kernel.states import LifecycleState
from store.redis_store import RedisStore
from tests.api.conftest import Keys
from tests.fleet.harness import InProcessFleet

pytestmark = pytest.mark.redis


def sign_in(http: TestClient, key: str) -> None:
    reply = http.post("/ui/signin", data={"key": key, "next": "/ui/"}, follow_redirects=False)
    assert reply.status_code == 303, reply.text


def decision(rec: TrajectoryRecord, **change: object) -> dict[str, object]:
    assert rec.held is not None
    body = {"decision": "approve", "version": rec.held.held_version, "digest": rec.held.digest}
    return {**body, "comment": "", **change}


def decide_path(rec: TrajectoryRecord) -> str:
    assert rec.held is not None
    return f"/ui/trajectories/{rec.trajectory_id}/approvals/{rec.held.approval_id}"


def test_a_wrong_key_is_refused_by_name_and_signs_nobody_in(http: TestClient, keys: Keys) -> None:
    reply = http.post("/ui/signin", data={"key": "rk_00000000_nope", "next": "/ui/inbox"})
    assert reply.status_code == 401
    assert "unknown or revoked" in reply.text and 'aria-invalid="true"' in reply.text
    assert "set-cookie" not in reply.headers
    door = http.get("/ui")  # the address the README gives leads to the sign-in form
    assert door.status_code == 200 and str(door.url).endswith("/ui/signin?next=/ui/")
    assert '<label for="key">API key</label>' in door.text
    away = http.get("/ui/inbox", follow_redirects=False)
    assert away.status_code == 303 and away.headers["location"] == "/ui/signin?next=/ui/inbox"

    reply = http.post(
        "/ui/signin", data={"key": keys.acme, "next": "//evil.example/"}, follow_redirects=False
    )
    assert reply.status_code == 303 and reply.headers["location"] == "/ui/inbox"
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    assert http.get("/ui/inbox").status_code == 200

    out = http.post("/ui/signout", follow_redirects=False)
    assert out.status_code == 303
    assert http.get("/ui/inbox", follow_redirects=False).status_code == 303


def test_a_form_from_another_origin_is_refused_and_changes_nothing(
    http: TestClient, keys: Keys, store: RedisStore, acme_held: TrajectoryRecord
) -> None:
    sign_in(http, keys.acme)
    tid = acme_held.trajectory_id
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed page, a redirect from elsewhere
        {"Sec-Fetch-Site": "cross-site"},
        {"Referer": "http://evil.example/ui/inbox"},  # and no Origin
        {"Referer": "https://testserver/ui/inbox"},  # another scheme is another origin
    ):
        reply = http.post(decide_path(acme_held), data=decision(acme_held), headers=headers)
        assert reply.status_code == 403 and "own pages" in reply.text, headers
        paused = http.post(f"/ui/trajectories/{tid}/control/pause", headers=headers)
        assert paused.status_code == 403, headers
    after = store.load("acme", tid)
    assert after.record_version == acme_held.record_version
    assert after.state is LifecycleState.AWAITING_APPROVAL and after.pending_control is None

    own = {"Referer": f"http://testserver/ui/trajectories/{tid}"}  # the console's own page
    paused = http.post(f"/ui/trajectories/{tid}/control/pause", headers=own)
    assert paused.status_code == 200, paused.text[-300:]
    assert store.load("acme", tid).record_version > acme_held.record_version


def test_a_stale_or_expired_decision_shows_why_it_was_refused_and_changes_nothing(
    http: TestClient, keys: Keys, store: RedisStore, acme_held: TrajectoryRecord
) -> None:
    rec = acme_held
    assert rec.held is not None
    sign_in(http, keys.acme)
    stale = http.post(decide_path(rec), data=decision(rec, version=rec.held.held_version - 1))
    assert stale.status_code == 409
    assert "Refused (Wrong version)" in stale.text
    assert f"held at version {rec.held.held_version}" in stale.text
    assert store.load("acme", rec.trajectory_id).record_version == rec.record_version

    bad = http.post(decide_path(rec), data=decision(rec, version="one"))
    assert bad.status_code == 422 and "version" in bad.text

    expired = store.load("acme", rec.trajectory_id)
    assert expired.held is not None
    expired.held.expires_at = 1.0
    expired.record_version += 1
    store.compare_and_set(expired, rec.record_version)
    late = http.post(decide_path(rec), data=decision(rec))
    assert late.status_code == 409 and "Refused (Approval expired)" in late.text
    after = store.load("acme", rec.trajectory_id)
    assert after.record_version == expired.record_version
    assert after.held is not None and after.held.status is ApprovalStatus.HELD
    assert "expired" in http.get("/ui/inbox").text  # the countdown says so too


def test_a_denial_keeps_the_reviewers_comment_in_the_chain_and_on_the_page(
    http: TestClient, keys: Keys, store: RedisStore, acme_held: TrajectoryRecord
) -> None:
    rec = acme_held
    sign_in(http, keys.acme)
    words = "the order was refunded <b>by phone</b>"
    reply = http.post(
        decide_path(rec), data=decision(rec, decision="deny", comment=words), follow_redirects=False
    )
    assert reply.status_code == 303
    assert reply.headers["location"] == f"/ui/trajectories/{rec.trajectory_id}"
    rows = store.read("acme", rec.trajectory_id)
    denied = [r for r in rows if r.kind is RowKind.APPROVAL and r.outcome == "denied"]
    assert len(denied) == 1 and denied[0].detail == {
        "approval_id": rec.held.approval_id if rec.held else "",
        "reviewer": "reviewer",
        "comment": words,
    }
    page = http.get(reply.headers["location"]).text
    assert "the order was refunded &lt;b&gt;by phone&lt;/b&gt;" in page  # escaped, not markup
    assert http.get("/ui/inbox/items").text.count("data-key=") == 0

    again = http.post(decide_path(rec), data=decision(rec, decision="deny"))  # decided already
    assert again.status_code == 409
    assert "Refused (Approval closed)" in again.text and "is denied" in again.text


def test_the_list_filters_narrow_it_and_a_bad_filter_is_named(
    http: TestClient, keys: Keys, acme_held: TrajectoryRecord
) -> None:
    tid = acme_held.trajectory_id
    sign_in(http, keys.acme)
    shown = {
        "": True,
        "?state=AWAITING_APPROVAL": True,
        "?state=COMPLETED": False,
        "?stop_reason=done": False,
        "?agent=support_store": True,
        "?agent=nobody": False,
        "?age=15m": True,
    }
    for query, present in shown.items():
        reply = http.get(f"/ui/trajectories{query}")
        assert reply.status_code == 200 and (tid in reply.text) is present, query
    for query, field in (
        ("state=BOGUS", "state"),
        ("age=3y", "age"),
        ("colour=red", "colour"),
        ("stop_reason=tired", "stop_reason"),
    ):
        reply = http.get(f"/ui/trajectories?{query}")
        assert reply.status_code == 422 and f"{field}:" in reply.text, query


def test_scopes_decide_what_a_key_sees_and_may_do(
    http: TestClient, keys: Keys, store: RedisStore, acme_held: TrajectoryRecord
) -> None:
    tid = acme_held.trajectory_id
    sign_in(http, keys.acme_read_only)
    assert tid in http.get("/ui/inbox").text and "Approve" not in http.get("/ui/inbox").text
    detail = http.get(f"/ui/trajectories/{tid}").text
    assert "may not pause" in detail and "control-kill" not in detail
    assert http.post(decide_path(acme_held), data=decision(acme_held)).status_code == 403
    assert http.post(f"/ui/trajectories/{tid}/control/kill").status_code == 403
    fairness = http.get("/ui/fairness").text
    assert "acme" in fairness and "globex" not in fairness and "The ring" not in fairness

    sign_in(http, keys.operator)
    every = http.get("/ui/fairness")
    assert every.status_code == 200 and "globex" in every.text and "The ring" in every.text
    tenants_only = http.get("/ui/inbox")
    assert tenants_only.status_code == 403 and "scope" in tenants_only.text
    after = store.load("acme", tid)
    assert after.record_version == acme_held.record_version
    assert after.state is LifecycleState.AWAITING_APPROVAL


def test_a_control_button_acts_as_the_key_and_a_refused_one_says_why(
    http: TestClient, keys: Keys, store: RedisStore, acme_held: TrajectoryRecord
) -> None:
    tid = acme_held.trajectory_id
    sign_in(http, keys.acme)
    early = http.post(f"/ui/trajectories/{tid}/control/resume")
    assert early.status_code == 409, early.text[-400:]
    assert store.load("acme", tid).record_version == acme_held.record_version

    paused = http.post(f"/ui/trajectories/{tid}/control/pause", follow_redirects=False)
    assert paused.status_code == 303 and paused.headers["location"] == f"/ui/trajectories/{tid}"
    after = store.load("acme", tid)
    assert after.record_version > acme_held.record_version
    assert after.state is LifecycleState.PAUSED or after.pending_control is not None
    page = http.get(f"/ui/trajectories/{tid}").text
    assert f">{after.state.value}<" in page and "by reviewer" in page


def test_the_pages_event_stream_is_the_chain_and_resumes_after_the_last_event(
    http: TestClient,
    keys: Keys,
    store: RedisStore,
    redis_client: redis.Redis,
    key_prefix: str,
    fleet_file: Path,
    acme_held: TrajectoryRecord,
) -> None:
    rec = acme_held
    sign_in(http, keys.acme)
    killed = http.post(f"/ui/trajectories/{rec.trajectory_id}/control/kill")
    assert killed.status_code == 200
    InProcessFleet(redis_client, key_prefix, fleet_file).run_until_quiet()  # to its stop
    chain = store.read("acme", rec.trajectory_id)
    assert chain[-1].kind is RowKind.STOP

    path = f"/ui/trajectories/{rec.trajectory_id}/events"
    resumed = http.get(path, headers={"Last-Event-ID": "2"})
    assert resumed.headers["content-type"].startswith("text/event-stream")
    ids = [int(line[4:]) for line in resumed.text.splitlines() if line.startswith("id: ")]
    assert ids == [row.index for row in chain[3:]]
    assert http.get(path, headers={"Last-Event-ID": "two"}).status_code == 422
    page = http.get(f"/ui/trajectories/{rec.trajectory_id}").text
    assert 'data-ended="true"' in page  # an ended run's page opens no stream


def test_a_revoked_key_is_signed_out_at_its_next_request(
    http: TestClient, redis_client: redis.Redis, key_prefix: str
) -> None:
    ring = KeyRing(redis_client, key_prefix)  # remembers nothing: revocation is at once
    http.app.state.front.keys = ring  # type: ignore[attr-defined]
    key, grant = ring.create("acme", "reviewer", {Scope.READ, Scope.DECIDE})
    sign_in(http, key)
    assert http.get("/ui/inbox").status_code == 200
    assert ring.revoke(grant.key_id)
    away = http.get("/ui/inbox", follow_redirects=False)
    assert away.status_code == 303 and away.headers["location"].startswith("/ui/signin")
    assert http.get("/ui/inbox/items", follow_redirects=False).status_code == 303
