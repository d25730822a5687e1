"""An open event stream asks again, every ``REINS_API_KEY_CACHE_S``, whether its key holds, and
ends once the key is revoked: on the API's stream (a bearer key) and on the console's (a
signed-in key). The API runs as a process of its own; the run is never admitted (no router),
so nothing but the revocation can end its streams."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import redis

from api.events import REVOKED
from api.keys import KeyRing, Scope
from ops.local.fleet import LocalFleet
from tests.api.conftest import AGENT
from tests.api.processes import start_api

pytestmark = pytest.mark.redis
BOUND_S = 30.0  # how long the test waits for a stream to end (the key cache is 1 s here)


def lines_until_closed(lines: Iterator[str], bound_s: float) -> list[str]:
    """Every line of a stream until the server closes it; fails past ``bound_s`` (a stream
    that outlives its key sends a keepalive every 15 s, so this is checked at least that
    often)."""
    seen: list[str] = []
    deadline = time.monotonic() + bound_s
    for line in lines:
        seen.append(line)
        if time.monotonic() > deadline:
            pytest.fail(f"the stream was still open {bound_s} s after the revocation: {seen}")
    return seen


def test_an_open_event_stream_ends_once_its_key_is_revoked(
    fleet: LocalFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    url = start_api(fleet, env={"REINS_API_KEY_CACHE_S": "1"})
    ring = KeyRing(redis_client, key_prefix)
    key, grant = ring.create("acme", "reviewer", {Scope.SUBMIT, Scope.READ})
    auth = {"Authorization": f"Bearer {key}"}
    job = {"agent": AGENT, "goal": "refund ord_1", "user": "cu_ana"}
    tid = httpx.post(f"{url}/v1/trajectories", json=job, headers=auth).json()["trajectory_id"]

    console = httpx.Client(base_url=url, timeout=20.0)
    api = httpx.Client(base_url=url, timeout=20.0, headers=auth)
    try:
        signed = console.post("/ui/signin", data={"key": key, "next": "/ui/"})
        assert signed.status_code == 303, signed.text
        with (
            api.stream("GET", f"/v1/trajectories/{tid}/events") as by_key,
            console.stream("GET", f"/ui/trajectories/{tid}/events") as by_cookie,
        ):
            for stream in (by_key, by_cookie):  # both began: their headers came back
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
            assert ring.revoke(grant.key_id)
            for stream in (by_key, by_cookie):
                seen = lines_until_closed(stream.iter_lines(), BOUND_S)
                assert REVOKED.decode().strip() in seen, seen
        assert api.get(f"/v1/trajectories/{tid}").status_code == 401
    finally:
        console.close()
        api.close()
