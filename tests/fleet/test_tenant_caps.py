"""Per-tenant caps on real processes: ``acme`` may have at most 2 turns in flight across the
fleet (``max_in_flight = 2``), ``globex`` and ``initech`` have no cap. Two routers and two
Celery workers (follow-on turns on: workers admit turns themselves too) run a backlog of
refunds with a 0.2 s model. A sampler reads, as often as it can, both the shared admitter's
count of acme's turns in flight and the store's count of acme's acting trajectories; neither
ever passes 2, and both reach it (the cap binds). ``w2`` is SIGKILLed while it holds an acme
turn: the reconciler recovers it and the slot comes back, so acme finishes. Every trajectory
ends, no turn is admitted twice, and no turn is left in flight at the end."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from kernel.states import TERMINAL
from ops.local.fleet import LocalFleet
from router.admission.redis.gates import admitter_tag
from router.wire.custody import Custody
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.fleet.conftest import FLEET_AGENTS
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import caller_api, start, stop_all, wait_all_ended
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
CAP = 2
TENANTS = "quantum_tokens = 1000\ncredit_cap_tokens = 12000\n" + "".join(
    f'[[tenants]]\nname = "{name}"\nweight = {weight}\nmax_ready = 1000\n'
    f"largest_call_tokens = 8000\nbudget_max = {{ steps = 40 }}\n{extra}\n"
    f"agents = {json.dumps(list(FLEET_AGENTS))}\n"
    for name, weight, extra in (
        ("acme", 3, f"max_in_flight = {CAP}"),
        ("globex", 2, ""),
        ("initech", 1, ""),
    )
)
CAPS_ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",  # every recovery is the reconciler's, not the broker's
    "REINS_SCRIPTED_LATENCY_S": "0.2",  # turns stay in flight long enough to be sampled
}
ACME_CODES = ("2", "3")  # the store's index scores of CALLING_MODEL and WAITING_TOOL


class Sampler:
    """Reads acme's turns in flight (admitter) and acting trajectories (store) in a loop."""

    def __init__(self, client: redis.Redis, prefix: str, store: RedisStore) -> None:
        self.client = client
        self.in_flight_key = f"{admitter_tag(prefix)}:f:0"  # acme is the file's first lane
        # the tenant's state index: one key, or (a store that buckets it) several
        keys: Any = getattr(store, "index_keys", None)
        self.index_keys = tuple(keys("acme")) if keys else (store.index_key("acme"),)
        self.samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            pipe = self.client.pipeline(transaction=True)  # one instant: both counts
            pipe.hlen(self.in_flight_key)
            for key in self.index_keys:
                pipe.zcount(key, *ACME_CODES)
            flying, *acting = pipe.execute()
            self.samples.append((int(flying), sum(int(n) for n in acting)))
            self._stop.wait(0.002)  # a sampling period, not a synchronisation


def test_a_capped_tenant_never_has_more_than_its_cap_in_flight_and_survives_a_crash(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, key_prefix: str
) -> None:
    tenants = tmp_path / "capped.toml"
    tenants.write_text(TENANTS)
    env = {**fleet_env, **CAPS_ENV, "REINS_TENANTS_FILE": str(tenants)}
    fleet = LocalFleet(env, tmp_path, redis_client)
    store, custody = RedisStore(redis_client, prefix=key_prefix), Custody(redis_client, key_prefix)
    try:
        start(fleet)
        api = caller_api(env, redis_client, "redis", None)
        orders = seed_orders(redis_client, key_prefix, 1000, 60)
        with Sampler(redis_client, key_prefix, store) as sampler:
            ids = submit_refunds(api, orders, ["acme", "globex", "initech"])
            acme = {tid for tenant, tid in ids if tenant == "acme"}

            def w2_holds_acme() -> bool:
                return any(h.trajectory_id in acme for h in custody.entrusted_to("w2"))

            wait_for(w2_holds_acme, 60, "w2 to hold a turn of acme", every_s=0.02)
            fleet.kill("w2")  # SIGKILL: its turns, acme's among them, end in no notice
            wait_all_ended(store, ids, 120, fleet)
        flying = max(f for f, _ in sampler.samples)
        acting = max(a for _, a in sampler.samples)
        print(
            f"\n{len(sampler.samples)} samples: at most {flying} acme turns in flight, "
            f"{acting} acme trajectories acting; {len(custody.recoveries())} recovered"
        )
        assert flying <= CAP and acting <= CAP, (flying, acting)
        assert flying == CAP and acting == CAP, "the cap binds: acme has a backlog"
        assert all(store.load(t, i).state in TERMINAL for t, i in ids)
        assert any(e["member"] == "w2" for e in custody.recoveries()), "w2's turns recovered"
        entries = Feed(redis_client, key_prefix).admissions()
        # routers' admissions name (trajectory, version); workers' follow-on ones do not
        admitted = Counter((e["id"], e["v"]) for e in entries if "id" in e)
        assert admitted and max(admitted.values()) == 1, "no turn admitted twice"
        # Every slot came back: the dead worker's too (recovered, or ended by the sweep).
        wait_for(
            lambda: all(
                redis_client.hlen(f"{admitter_tag(key_prefix)}:f:{lane}") == 0 for lane in range(3)
            ),
            30,
            "no turn left in flight",
        )
        codes = stop_all(fleet)
        assert codes == {"r1": 0, "r2": 0, "w1": 0}, codes
    finally:
        fleet.close()
