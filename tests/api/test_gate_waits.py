"""A READY run whose model route's gate holds its next call back (the admitter's
backpressure: nothing is sent, admission asks the gate again every cycle) shows what it waits
for in the API's view, read from the gate; the view's tag changes with it, so a client that
polls with ``If-None-Match`` sees the wait begin and end."""

from __future__ import annotations

import redis
from fastapi.testclient import TestClient

from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from tests.api.conftest import AGENT, Keys

ROUTE = "scripted/refund-policy"  # the support store agent's model
JOB = {"agent": AGENT, "goal": "refund the damaged item on order ord_1001", "user": "cu_ana"}


def test_a_ready_run_behind_a_full_gate_names_the_gate_until_it_has_room(
    http: TestClient, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    headers = keys.auth(keys.acme)
    tid = http.post("/v1/trajectories", json=JOB, headers=headers).json()["trajectory_id"]
    shown = http.get(f"/v1/trajectories/{tid}", headers=headers)
    assert shown.json()["state"] == "READY" and shown.json()["waiting"] == []
    plain = shown.headers["ETag"]

    config = GateConfig.from_mapping({"routes": {ROUTE: {"concurrency": 1, "lease_ttl_s": 60}}})
    gates = RedisGates(redis_client, config, prefix=key_prefix)
    gates.configure()
    assert gates.debit(ROUTE, "another-run", 100).ok, "another run holds the one slot"
    held = http.get(f"/v1/trajectories/{tid}", headers={**headers, "If-None-Match": plain})
    assert held.status_code == 200, "the view changed though the record did not"
    assert held.json()["waiting"] == [
        {"call_id": f"{tid}/m1", "tool": "model", "on": f"{ROUTE} (concurrency)"}
    ]
    assert held.headers["ETag"] != plain
    again = http.get(
        f"/v1/trajectories/{tid}", headers={**headers, "If-None-Match": held.headers["ETag"]}
    )
    assert again.status_code == 304, "nothing changed since"

    gates.release(ROUTE, "another-run")
    free = http.get(f"/v1/trajectories/{tid}", headers=headers)
    assert free.json()["waiting"] == [] and free.headers["ETag"] == plain
