"""A trajectory held for approval, made through the API and an in-process router and worker."""

from __future__ import annotations

from pathlib import Path

import redis
from fastapi.testclient import TestClient

from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState
from tests.api.conftest import AGENT
from tests.fleet.harness import InProcessFleet, seed_orders


def refund_body(order_id: str, cents: int = 9000) -> dict[str, object]:
    """A refund above the automatic limit (5,000 cents): it is held for a reviewer."""
    return {
        "agent": AGENT,
        "goal": f"refund {cents} cents on the damaged item of order {order_id}",
        "user": "cu_ana",
    }


def held_refund(
    http: TestClient,
    auth: dict[str, str],
    client: redis.Redis,
    prefix: str,
    fleet_file: Path,
) -> TrajectoryRecord:
    """Submit a refund through the API; run it in process until it is held; the record."""
    oid = seed_orders(client, prefix, 7000, 1, total=12_000)[0]
    reply = http.post("/v1/trajectories", json=refund_body(oid), headers=auth)
    assert reply.status_code == 201, reply.text
    tid = reply.json()["trajectory_id"]
    fleet = InProcessFleet(client, prefix, fleet_file)
    fleet.run_until_quiet()
    fleet.service.dispatcher.flush()  # the admissions' figures, as a router's tick writes them
    tenant = "acme"
    rec = fleet.load(tenant, tid)
    assert rec.state is LifecycleState.AWAITING_APPROVAL, rec.state
    return rec
