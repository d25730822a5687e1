"""Tool capacity across the fleet, on real processes: the fleet's document gives the refund
tool a capacity of 3 calls at once (gate ``tool/issue_refund``). Two Celery workers, 32 threads
each, run 18 refund trajectories whose writes each take 2.5 s (``tests.fleet.paced_backend``).
The backend's own record of every refund's span shows at most 3 in flight at any moment, and
3 reached; the email tool, which has no gate, is not held to it; every trajectory ends done."""

from __future__ import annotations

import json

import pytest

from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.fleet.conftest import ROUTE
from tests.fleet.documents import config_apply, fleet_document
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.paced_backend import spans_key
from tests.fleet.processes import caller_api, start, stop_all, wait_all_ended

pytestmark = [pytest.mark.redis, pytest.mark.slow]
BACKEND = "tests.fleet.paced_backend:paced_support_store"
CAPACITY = 3
TRAJECTORIES = 18


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of spans overlapping at one instant (an end before a start)."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    at_once = most = 0
    for _, step in edges:
        at_once += step
        most = max(most, at_once)
    return most


def test_a_tool_with_a_capacity_runs_at_most_that_many_calls_across_the_fleet(
    document_fleet: LocalFleet, document_env: dict[str, str]
) -> None:
    client, key_prefix = document_fleet.client, document_env["REINS_KEY_PREFIX"]
    doc = document_fleet.log_dir / "fleet.toml"
    gates = (
        f'[gates.routes."{ROUTE}"]\nconcurrency = 16\nlease_ttl_s = 20\n'
        f'[gates.routes."tool/issue_refund"]\nconcurrency = {CAPACITY}\nlease_ttl_s = 1.5\n'
    )
    doc.write_text(fleet_document({"acme": 1}, gate=gates))
    config_apply(document_env, doc)
    # A refund may queue for 6 others' 2.5 s: turns may last that long.
    slow = {"REINS_MAX_TURN_S": "20", "REINS_VISIBILITY_TIMEOUT_S": "40"}
    start(
        document_fleet,
        worker_args=("--backend", BACKEND),
        env={**slow, "REINS_STALL_TIMEOUT_S": "60"},
    )
    api = caller_api(document_env, client, "redis", None)
    ids = submit_refunds(api, seed_orders(client, key_prefix, 1000, TRAJECTORIES), ["acme"])
    store = RedisStore(client, prefix=key_prefix)
    wait_all_ended(store, ids, 240, document_fleet)

    spans = [json.loads(raw) for raw in client.lrange(spans_key(key_prefix), 0, -1)]
    refunds = [(a, b) for tool, a, b in spans if tool == "issue_refund"]
    emails = [(a, b) for tool, a, b in spans if tool == "send_status_email"]
    print(f"\nrefunds at once {most_at_once(refunds)}, emails at once {most_at_once(emails)}")
    assert len(refunds) == TRAJECTORIES
    assert most_at_once(refunds) == CAPACITY, "held to the capacity, and the capacity used"
    assert most_at_once(emails) > CAPACITY, "a tool without a gate is not held to it"
    records = [store.load(t, i) for t, i in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * TRAJECTORIES
    assert stop_all(document_fleet) == {"r1": 0, "r2": 0, "w1": 0, "w2": 0}
