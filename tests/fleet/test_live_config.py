"""The fleet reconfigured while it runs, on real processes: two routers and two Celery workers
run from the fleet's document in Redis; ``reins config apply`` changes the weights from 3:2:1
to 1:1:4 mid-run. The shares of the admitted charge follow the new weights, a router booted
after the change runs and admits, and no turn is admitted twice."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.local.fleet import LocalFleet
from router.wire.feed import Feed
from tests.fleet.documents import config_apply, fleet_document
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import caller_api, start, stop_all
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
BAND_PP = 2.0  # the band, for the shares on either side of the change
OLD = {"acme": 3, "globex": 2, "initech": 1}
NEW = {"acme": 1, "globex": 1, "initech": 4}
WINDOW = 450  # backlogged admissions measured on each side of the change
# The first admissions are the fleet's ramp (routers joining, each lane's first claims in
# flight): the shares of the old weights are measured after them, in the steady state.
WARMUP = 100


def charge_shares(entries: list[dict[str, Any]], key: str = "t") -> dict[str, float]:
    charge: Counter[str] = Counter()
    for e in entries:
        charge[e[key]] += e["c"]
    total = sum(charge.values()) or 1
    return {t: c / total for t, c in charge.items()}


def gap_pp(measured: dict[str, float], weights: dict[str, int]) -> float:
    total = sum(weights.values())
    return max(abs(measured.get(t, 0.0) - w / total) * 100 for t, w in weights.items())


def test_config_apply_mid_run_moves_the_shares_to_the_new_weights(
    document_fleet: LocalFleet,
    document_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    old_doc, new_doc = tmp_path / "fleet-v1.toml", tmp_path / "fleet-v2.toml"
    old_doc.write_text(fleet_document(OLD))
    new_doc.write_text(fleet_document(NEW))
    assert "v1 applied" in config_apply(document_env, old_doc)
    start(document_fleet)
    api = caller_api(document_env, redis_client, "redis", None)
    feed = Feed(redis_client, key_prefix)
    # initech gets twice the work: at 4 of 6 it must stay backlogged after the change.
    orders = seed_orders(redis_client, key_prefix, 1000, 800)
    submit_refunds(api, orders, ["acme", "globex", "initech", "initech"])

    def backlogged(since: float) -> list[dict[str, Any]]:
        return [e for e in feed.admissions() if e["b"] and e["at"] > since]

    wanted = WINDOW + WARMUP
    wait_for(lambda: len(backlogged(0.0)) >= wanted, 120, f"{wanted} admissions before")
    # The old weights hold until the new version is written, some time inside the command (a
    # process start); the new ones from a tick after it returns. Between is the change itself.
    applying_at = time.time()
    assert "v2 applied" in config_apply(document_env, new_doc)
    changed_at = time.time()
    tick = float(document_env["REINS_HEARTBEAT_INTERVAL_S"]) / 2
    steady = sorted(backlogged(0.0), key=lambda e: e["at"])[WARMUP:]
    before = charge_shares([e for e in steady if e["at"] <= applying_at])
    document_fleet.start("router", "r3")  # boots on the new version
    document_fleet.wait_ready(["w1", "w2"], ["r1", "r2", "r3"])

    wait_for(
        lambda: len(backlogged(changed_at + tick)) >= WINDOW, 120, f"{WINDOW} admissions after"
    )
    after_entries = backlogged(changed_at + tick)
    after = charge_shares(after_entries)
    print(f"\nbefore {before}\nafter {after} over {len(after_entries)} admissions")
    assert gap_pp(before, OLD) <= BAND_PP, before
    assert gap_pp(after, NEW) <= BAND_PP, after

    entries = feed.admissions()
    admitted = Counter((e["id"], e["v"]) for e in entries if "id" in e)
    assert admitted and max(admitted.values()) == 1, "no turn admitted twice"
    wait_for(lambda: any(e["r"] == "r3" for e in feed.admissions()), 60, "r3 to admit")
    logs = "".join(document_fleet.log(r) for r in ("r1", "r2"))
    assert logs.count("configuration version 2 applied") == 2, "both routers followed"
    assert "configuration version 2 applied" not in document_fleet.log("r3")
    codes = stop_all(document_fleet)
    assert codes == {"r1": 0, "r2": 0, "r3": 0, "w1": 0, "w2": 0}, codes
    assert json.loads(redis_client.hget(f"{key_prefix}:fleet:config", "version") or b"0") == 2
