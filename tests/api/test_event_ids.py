"""``Last-Event-ID`` names a row the chain holds, on the API's stream and on the console's: a
number past the chain's end (2**63, twenty nines, one past the last row) is a 422 naming the
header before the stream begins, never a 200 cut short by Redis."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kernel.record import TrajectoryRecord
from tests.api.conftest import Keys

pytestmark = pytest.mark.redis

OUT_OF_RANGE = (str(2**63), "9" * 20, str(2**63 - 1), "+1", "1_0", "-1", "x")


def sign_in(http: TestClient, key: str) -> None:
    reply = http.post("/ui/signin", data={"key": key, "next": "/ui/"}, follow_redirects=False)
    assert reply.status_code == 303, reply.text


@pytest.mark.parametrize("route", ["/v1", "/ui"])
def test_a_last_event_id_outside_the_chain_is_a_422_naming_the_header(
    http: TestClient, keys: Keys, acme_held: TrajectoryRecord, route: str
) -> None:
    tid, length = acme_held.trajectory_id, acme_held.chain_length
    assert length >= 2
    if route == "/ui":
        sign_in(http, keys.acme)
        auth: dict[str, str] = {}
    else:
        auth = keys.auth(keys.acme)
    path = f"{route}/trajectories/{tid}/events"
    for raw in (*OUT_OF_RANGE, str(length)):
        reply = http.get(path, headers={**auth, "Last-Event-ID": raw}, params={"follow": "false"})
        assert reply.status_code == 422, (raw, reply.status_code, reply.text[:300])
        if route == "/v1":
            problem = reply.json()
            assert problem["field"] == "Last-Event-ID", raw
            assert problem["code"] == "last_event_id_out_of_range", raw
        else:
            assert "Last-Event-ID" in reply.text, raw

    if route == "/ui":
        return  # the console's stream always follows (to the stop): its resumption is
        # tested on an ended run in tests/console/test_pages.py
    # the last row the chain holds is in range: the rest of the stream is empty, not refused
    last = http.get(
        path, headers={**auth, "Last-Event-ID": str(length - 1)}, params={"follow": "false"}
    )
    assert last.status_code == 200 and "id: " not in last.text
    first = http.get(path, headers={**auth, "Last-Event-ID": "0"}, params={"follow": "false"})
    ids = [int(line[4:]) for line in first.text.splitlines() if line.startswith("id: ")]
    assert ids == list(range(1, length))
