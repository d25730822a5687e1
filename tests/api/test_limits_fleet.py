"""``reins limits trial --fleet``: the trial through the API on real processes, as a tenant's
key: every task under every candidate cap, held refunds decided as the task says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from kernel.states import LifecycleState
from ops.local.fleet import LocalFleet
from store.redis_store import RedisStore
from tests.api.conftest import AGENT, Keys
from tests.api.processes import start_fleet
from tests.fleet.harness import seed_orders

pytestmark = pytest.mark.redis


def test_a_trial_on_the_fleet_measures_each_cap_as_a_policy(
    fleet: LocalFleet, keys: Keys, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    url = start_fleet(fleet)
    # every candidate acts on the same orders (the fleet's backend is shared): room for a
    # refund under each of the two caps
    orders = seed_orders(redis_client, key_prefix, 8300, 5, total=20_000)
    tasks = tmp_path / "tasks.jsonl"
    lines = [{"goal": f"refund the damaged item on order {o}"} for o in orders[:3]]
    lines.append({"goal": f"refund 9000 cents on order {orders[3]}"})  # held, approved
    lines.append({"goal": f"refund 9000 cents on order {orders[4]}", "approve": False})
    tasks.write_text("".join(json.dumps(x) + "\n" for x in lines))
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "from ops.cli.main import main; main()",
            "limits",
            "trial",
            AGENT,
            "--tasks",
            str(tasks),
            "--caps",
            "steps=4,8",
            "--fleet",
            "--json",
            "--timeout",
            "240",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "REINS_API_URL": url, "REINS_API_KEY": keys.acme},
    )
    assert p.returncode == 0, p.stderr
    rows = {r["cap"]: r for r in json.loads(p.stdout)["candidates"]}
    assert sorted(rows) == [4, 8]
    for r in rows.values():
        assert r["tasks"] == 5 and sum(r["stop_reasons"].values()) == 5
    # the refund takes five steps: four cut every run off; eight accepts all but the denied one
    assert rows[4]["accepted"] == 0 and rows[4]["stop_reasons"].get("max_steps", 0) >= 3
    assert rows[8]["accepted"] == 4 and rows[8]["stop_reasons"]["done"] == 4
    assert rows[8]["approvals_asked"] >= 2  # both large refunds asked the reviewer
    assert rows[8]["cost_per_accepted"] > 0
    # every run the trial submitted is the tenant's, ended, in the store: ten, no more
    store = RedisStore(redis_client, prefix=key_prefix)
    ended = [store.list("acme", s) for s in (LifecycleState.COMPLETED, LifecycleState.FAILED)]
    assert sum(map(len, ended)) == 10 and not store.list("acme", LifecycleState.READY)
