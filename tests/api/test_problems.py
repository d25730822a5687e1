"""Error bodies and ``/readyz`` say what failed by a code and an id, never by the exception's
text (which names servers, addresses, sometimes credentials); the API's log line of the same
error holds the id and the cause."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kernel.errors import CorruptSnapshot, StoreUnavailable
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis
SECRET = "10.9.8.7:6379 password=hunter2"


def boom(exc: Exception) -> Any:
    def raising(*args: object, **kwargs: object) -> Any:
        raise exc

    return raising


def logged_with(caplog: pytest.LogCaptureFixture, error_id: str) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    return record


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (RuntimeError(f"cannot reach {SECRET}"), 500, "internal"),
        (CorruptSnapshot(f"snapshot at {SECRET} fails validation"), 500, "corrupt_snapshot"),
        (StoreUnavailable(f"no answer from {SECRET}"), 503, "store_unavailable"),
    ],
)
def test_a_failure_answers_a_code_and_an_id_and_logs_the_cause_under_that_id(
    http: TestClient,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    exc: Exception,
    status: int,
    code: str,
) -> None:
    monkeypatch.setattr(http.app.state.front.store, "load", boom(exc))  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="reins.api"):
        reply = http.get("/v1/trajectories/traj-1", headers=keys.auth(keys.acme))
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/problem+json"
    problem = reply.json()
    assert problem["code"] == code
    assert re.fullmatch(r"[0-9a-f]{16}", problem["error_id"])
    for leak in ("hunter2", "10.9.8.7", type(exc).__name__):
        assert leak not in reply.text, leak
    record = logged_with(caplog, problem["error_id"])
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert "hunter2" in str(record.exc_info[1]), "the log line has the cause"


def test_readyz_says_not_ready_by_a_code_and_an_id_not_by_the_redis_error(
    http: TestClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert http.get("/readyz").status_code == 200
    front = http.app.state.front  # type: ignore[attr-defined]
    monkeypatch.setattr(front.client, "ping", boom(ConnectionError(f"Error 111 to {SECRET}")))
    with caplog.at_level(logging.INFO, logger="reins.api"):
        reply = http.get("/readyz")
    assert reply.status_code == 503
    body = reply.json()
    assert body["ready"] is False and body["code"] == "store_unavailable"
    assert "hunter2" not in reply.text and "10.9.8.7" not in reply.text
    assert "Error 111" not in reply.text
    record = logged_with(caplog, body["error_id"])
    assert record.exc_info is not None and "hunter2" in str(record.exc_info[1])


def test_a_refusal_carries_its_code_and_an_id_of_its_log_line_too(
    http: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="reins.api"):
        unknown = http.get("/v1/trajectories/traj-1", headers={"Authorization": "Bearer rk_x"})
        missing = http.get("/v1/trajectories/traj-1", headers=keys.auth(keys.acme))
        bad = http.get("/v1/trajectories", params={"limit": "many"}, headers=keys.auth(keys.acme))
    for reply, status, code in (
        (unknown, 401, "unauthenticated"),
        (missing, 404, "not_found"),
        (bad, 422, "invalid_request"),
    ):
        problem = reply.json()
        assert (reply.status_code, problem["code"]) == (status, code), reply.text
        assert logged_with(caplog, problem["error_id"]).levelno == logging.INFO


def test_a_console_page_that_fails_shows_the_id_and_not_the_cause(
    http: TestClient, keys: Keys, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    signed = http.post("/ui/signin", data={"key": keys.acme, "next": "/ui/"})
    assert signed.status_code == 200
    exc = CorruptSnapshot(f"snapshot at {SECRET} fails validation")
    monkeypatch.setattr(http.app.state.front.store, "load", boom(exc))  # type: ignore[attr-defined]
    with caplog.at_level(logging.INFO, logger="reins.api"):
        reply = http.get("/ui/trajectories/traj-1")
    assert reply.status_code == 500 and "hunter2" not in reply.text
    (shown,) = re.findall(r"Error id <code>([0-9a-f]{16})</code>", reply.text)
    assert logged_with(caplog, shown).exc_info is not None
