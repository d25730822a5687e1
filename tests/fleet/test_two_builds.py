"""A rolling upgrade from the previous release to this build, on real processes of both.

The previous release (``CHANGELOG.md`` names its commit) is checked out of the clone's own
history and installed in a virtual environment of its own (``tests/fleet/builds.py``). Its
fleet starts as real processes: two workers, two routers and the API, configured by the
fleet's document (``reins config apply`` of that build, as the chart does) with keys its CLI
made. A client submits refunds through the API the whole time, retrying a refused connection
under the same ``Idempotency-Key``. Then each process is replaced by this build's in the
chart's documented order (``CHANGELOG.md``: routers and the API first, then workers), each
drained first: SIGTERM, wait for its exit, start the new build's under the same name, wait
until the ring holds it again. Each worker is replaced while it holds turns.

At the end every trajectory ended ``done``; every order has one refund and one e-mail; the
support store, which cannot de-duplicate and counts every write it receives from either build
(``both_builds/shared_store.py``), received each write once; the reconciler recovered no turn;
and every process of the older build exited 0 after a drain. The broker's visibility timeout
is far past the test's end: nothing is rescued by a redelivery.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis

from examples.support_store.state import RedisState
from kernel.record import SCHEMA_VERSION
from kernel.states import StopReason
from ops.local.fleet import LocalFleet
from router.wire.custody import Custody
from store.redis_store import RedisStore
from tests.api.processes import free_port
from tests.conftest import REDIS_URL
from tests.fleet.both_builds.shared_store import received
from tests.fleet.builds import Build, installed, previous_release, run, this_build
from tests.fleet.conftest import WEIGHTS
from tests.fleet.documents import fleet_document
from tests.fleet.harness import refund_job, seed_orders
from tests.fleet.processes import ROOMY_TOTAL, effects_by_order, order_of, wait_all_ended
from tests.support import wait_for

# Installing the previous release (a venv from PyPI) and the roll itself take minutes.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(1500)]
BACKEND = "shared_store:undeduplicated"
WORKERS, ROUTERS = ("w1", "w2"), ("r1", "r2")
#: Model calls of 0.5 s, so turns are in flight whenever a process is replaced.
ENV = {
    "REINS_REDIS_URL": REDIS_URL,
    "REINS_BROKER_URL": REDIS_URL,
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "3",
    "REINS_SCRIPTED_LATENCY_S": "0.5",
    "REINS_WORKER_CONCURRENCY": "16",
    "REINS_DRAIN_GRACE_S": "30",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_MAX_TURN_S": "3",
    "REINS_STALL_TIMEOUT_S": "30",
}
FIRST_ORDER = 9000


class Client:
    """Submits refunds through the API at ``url`` (which the test moves when it replaces the
    API) until stopped, each on an order of its own seeded just before; a submission the API
    did not answer is sent again under the same ``Idempotency-Key``."""

    def __init__(self, client: redis.Redis, prefix: str, keys: dict[str, str]) -> None:
        self.client, self.prefix = client, prefix
        self.keys, self.url = keys, ""
        self.ids: list[tuple[str, str]] = []
        self.retried = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upgrade-client", daemon=True)

    def start(self, url: str) -> None:
        self.url = url
        self._thread.start()

    def _run(self) -> None:
        tenants = list(WEIGHTS)
        try:
            with httpx.Client(timeout=10.0) as http:
                for i in itertools.count():
                    if self._stop.wait(0.15):
                        return
                    tenant = tenants[i % len(tenants)]
                    (oid,) = seed_orders(self.client, self.prefix, FIRST_ORDER + i, 1, ROOMY_TOTAL)
                    self.ids.append((tenant, self._submit(http, tenant, oid)))
        except BaseException as exc:  # the test thread reports it
            self.error = exc

    def _submit(self, http: httpx.Client, tenant: str, oid: str) -> str:
        headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Idempotency-Key": oid}
        for _ in range(600):  # a minute of an API being replaced, at most
            try:
                reply = http.post(
                    f"{self.url}/v1/trajectories", json=refund_job(oid), headers=headers
                )
                if reply.status_code in (200, 201):
                    return str(reply.json()["trajectory_id"])
                if reply.status_code < 500:
                    raise AssertionError(f"submission refused: {reply.status_code} {reply.text}")
            except httpx.TransportError:
                pass
            self.retried += 1
            self._stop.wait(0.1)
        raise TimeoutError(f"no API took order {oid}")

    def submitted(self) -> int:
        if self.error is not None:
            raise self.error
        return len(self.ids)

    def halt(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def stop(self) -> list[tuple[str, str]]:
        self.halt()
        if self.error is not None:
            raise self.error
        return list(self.ids)


def cli(build: Build, env: dict[str, str], *args: str) -> str:
    """``reins ARGS`` of ``build`` (an operator's command), on the fleet of ``env``."""
    code = "from ops.cli.main import main; main()"
    base = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    return run(
        [build.python, "-c", code, *args], cwd=build.cwd, env={**base, **env, **build.env()}
    ).stdout


def stored_schema(client: redis.Redis, store: RedisStore, tenant: str, tid: str) -> int:
    """The schema version a record is stored under (``load`` reads older ones as this
    build's): 4 if only the older build ever wrote it."""
    data = client.hget(store.trajectory_keys(tenant, tid)[0], "data")
    assert isinstance(data, bytes), tid
    return int(json.loads(data)["schema_version"])


class Roll:
    """The fleet of both builds under one prefix, started and replaced by name."""

    def __init__(self, fleet: LocalFleet) -> None:
        self.fleet = fleet

    def start(self, build: Build, role: str, name: str, *args: str) -> None:
        self.fleet.start(role, name, *args, env=build.env(), python=build.python, cwd=build.cwd)

    def worker(self, build: Build, name: str) -> None:
        self.start(build, "worker", name, "--backend", BACKEND)

    def router(self, build: Build, name: str) -> None:
        self.start(build, "router", name, "--admitter", "redis")

    def api(self, build: Build) -> str:
        port = free_port()
        self.start(build, "api", "api", "--host", "127.0.0.1", "--port", str(port))
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            self.fleet._check_alive()
            try:
                return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, f"the {build.name} API to be ready")
        return url

    def drain(self, name: str) -> int:
        """SIGTERM (a drain) and the exit code, once it exited."""
        return self.fleet.stop(name, timeout_s=90)

    def ready(self) -> None:
        self.fleet.wait_ready(list(WORKERS), list(ROUTERS), timeout_s=90)


@pytest.fixture
def older(tmp_path: Path) -> Build:
    """The previous release's build (installed unless kept from an earlier run)."""
    return installed(previous_release(this_build().version()), tmp_path / "older")


def test_a_rolling_upgrade_from_the_previous_release_loses_nothing_and_runs_nothing_twice(
    older: Build, redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    newer = this_build()
    versions = {"older": older.version(), "newer": newer.version()}
    assert versions["older"] == previous_release(versions["newer"]).version
    assert versions["newer"] != versions["older"], "this build's version must be bumped"
    env = {**ENV, "REINS_KEY_PREFIX": key_prefix}
    document = tmp_path / "fleet.toml"
    document.write_text(fleet_document(WEIGHTS))
    cli(older, env, "config", "apply", str(document))
    keys = {
        t: json.loads(
            cli(older, env, "keys", "create", "--tenant", t, "--principal", "roll", "--json")
        )["key"]
        for t in WEIGHTS
    }
    (tmp_path / "logs").mkdir()
    fleet = LocalFleet(env, tmp_path / "logs", redis_client)
    roll = Roll(fleet)
    custody = Custody(redis_client, key_prefix)
    client = Client(redis_client, key_prefix, keys)
    try:
        for w in WORKERS:
            roll.worker(older, w)
        for r in ROUTERS:
            roll.router(older, r)
        client.start(roll.api(older))
        roll.ready()
        wait_for(lambda: client.submitted() >= 30, 60, "30 submissions to the older fleet")

        codes: dict[str, int] = {}
        for name in ROUTERS:  # routers first (CHANGELOG: the upgrade order) ...
            codes[name] = roll.drain(name)
            roll.router(newer, name)
            roll.ready()
        codes["api"] = roll.drain("api")  # ... and the API ...
        client.url = roll.api(newer)
        for n, name in enumerate(WORKERS):  # ... then workers, each while it holds turns
            # While every worker is old, turns pile up on each; once one runs this build, an
            # old one hands each turn back the moment it reads the record's newer schema, so
            # it holds one now and then, rarely four at once.
            holding = 4 if n == 0 else 1

            def busy(m: str = name, at_least: int = holding) -> bool:
                client.submitted()
                return len(custody.entrusted_to(m)) >= at_least

            wait_for(busy, 60, f"{name} to hold {holding} turns", every_s=0.005)
            codes[name] = roll.drain(name)
            roll.worker(newer, name)
            roll.ready()
        at_last = client.submitted()
        wait_for(lambda: client.submitted() >= at_last + 20, 60, "20 submissions after the roll")
        ids = client.stop()

        store = RedisStore(redis_client, prefix=key_prefix)
        wait_all_ended(store, ids, 240, fleet)
        took = time.monotonic() - began
        records = [store.load(t, i) for t, i in ids]
        logs = {name: fleet.log(name) for name in codes}  # the older build's lines, and more
    finally:
        client.halt()
        fleet.close()

    assert [r.trajectory_id for r in records if r.stop_reason is not StopReason.DONE] == []
    effects = effects_by_order(RedisState(redis_client, key_prefix, seed=False).effects())
    assert {order_of(r): dict(effects[order_of(r)]) for r in records} == {
        order_of(r): {"refund": 1, "email": 1} for r in records
    }
    writes = received(redis_client, key_prefix)
    assert {k: n for k, n in writes.items() if n != 1} == {}, "a write was sent twice"
    assert len(writes) == 2 * len(records)
    assert custody.recoveries() == [], "the drains left nothing for the reconciler"
    # the older build's processes each drained and exited 0
    assert codes == dict.fromkeys(codes, 0), {n: logs[n][-2000:] for n, c in codes.items() if c}
    for w in WORKERS:
        assert f"drain of {w} acknowledged by" in logs[w], logs[w][-3000:]
        assert "after the drain was acknowledged" not in logs[w]
    schemas = Counter(stored_schema(redis_client, store, t, i) for t, i in ids)
    refused = f"schema version {SCHEMA_VERSION} is not supported"
    handed_back = sum(logs[w].count(refused) for w in WORKERS)
    stranded = sum(
        int(n) for r in ROUTERS for n in re.findall(r"recovered (\d+) stranded turns", logs[r])
    )
    print(
        "\n"
        + json.dumps(
            {
                "two_build_upgrade": versions,
                "trajectories": len(records),
                "stored_schemas": dict(schemas),
                "handed_back_by_older_workers": handed_back,
                "stranded_turns_recovered": stranded,
                "most_recoveries_of_a_run": max(r.recoveries for r in records),
                "resubmitted": client.retried,
                "seconds": round(took, 1),
            }
        )
    )
