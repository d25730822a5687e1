"""Service classes kept across turns, on real processes: one tenant with two classes at 3:1
runs multi-turn refund trajectories through two routers and two Celery workers. Every
admission is made from the queue of its trajectory's own class (the record carries it, every
requeue uses it), and the admitted charge splits 3:1 over the turns after the first as well as
over all of them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import redis

from ops.local.fleet import LocalFleet
from router.wire.feed import Feed
from tests.fleet.documents import config_apply, fleet_document
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import caller_api, start, stop_all
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
BAND_PP = 2.0
CLASSES = {"interactive": 3, "maintenance": 1}
WINDOW = 600  # admissions measured, while both classes still have work queued


def class_shares(entries: list[dict[str, Any]], class_of: dict[str, str]) -> dict[str, float]:
    charge: Counter[str] = Counter()
    for e in entries:
        charge[class_of[e["id"]]] += e["c"]
    total = sum(charge.values()) or 1
    return {k: charge[k] / total for k in CLASSES}


def gap_pp(measured: dict[str, float]) -> float:
    total = sum(CLASSES.values())
    return max(abs(measured[k] - w / total) * 100 for k, w in CLASSES.items())


def test_two_classes_share_their_tenant_3_to_1_over_every_turn(
    document_fleet: LocalFleet, document_env: dict[str, str], redis_client: redis.Redis
) -> None:
    key_prefix, tmp_path = document_env["REINS_KEY_PREFIX"], document_fleet.log_dir
    doc = tmp_path / "fleet.toml"
    doc.write_text(fleet_document({"acme": 1}, {"acme": CLASSES}))
    config_apply(document_env, doc)
    start(document_fleet)
    api = caller_api(document_env, redis_client, "redis", None)
    feed = Feed(redis_client, key_prefix)
    class_of: dict[str, str] = {}
    # Work in the ratio of the weights, so both classes stay backlogged over the window.
    for n, order in enumerate(seed_orders(redis_client, key_prefix, 1000, 320)):
        klass = "maintenance" if n % 4 == 3 else "interactive"
        submitted = api.submit("acme", {**refund_job(order), "service_class": klass})
        class_of[submitted.trajectory_id] = klass

    def admitted() -> list[dict[str, Any]]:
        return [e for e in feed.admissions() if "id" in e]

    wait_for(lambda: len(admitted()) >= WINDOW, 150, f"{WINDOW} admissions")
    window = admitted()[:WINDOW]
    wrong = [e for e in window if e["k"] != class_of[e["id"]]]
    assert not wrong, f"{len(wrong)} admissions from another class's queue, e.g. {wrong[:3]}"
    seen: set[str] = set()
    later = []
    for e in window:
        if e["id"] in seen:
            later.append(e)
        seen.add(e["id"])
    overall, turns = class_shares(window, class_of), class_shares(later, class_of)
    print(f"\nall turns {overall}; after the first {turns} over {len(later)} admissions")
    assert len(later) >= WINDOW // 3, "later turns are measured, not only first calls"
    assert gap_pp(overall) <= BAND_PP, overall
    assert gap_pp(turns) <= BAND_PP, turns
    assert stop_all(document_fleet) == {"r1": 0, "r2": 0, "w1": 0, "w2": 0}
