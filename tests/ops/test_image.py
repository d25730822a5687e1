"""`make image` builds the Dockerfile, and what it built runs: ``reins --version``, the fleet's
configuration applied as the chart's init container applies it, then the API, a router and a
worker from the image running trajectories submitted through the API to their end, on the
test's Redis (podman; tests/ops/image.py says how it runs here).

The build is ``make image`` in this checkout (CI: a clean clone), so the image holds the wheel
of the code the other tests test; a test checks that file by file.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tomllib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from api.client import ReinsClient
from api.keys import KeyRing, Scope
from examples.support_store.state import RedisState
from kernel.states import StopReason
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.api.processes import start_api
from tests.conftest import REDIS_URL
from tests.fleet.conftest import WEIGHTS
from tests.fleet.documents import fleet_document
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    BACKEND,
    effects_by_order,
    order_of,
    sent_twice,
    stop_all,
    wait_all_ended,
)
from tests.ops import image as built
from tests.ops.image import DOCUMENT_PATH, ImageFleet

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
#: The packages the wheel holds (pyproject.toml, tool.setuptools.packages.find).
PACKAGES = ("kernel", "store", "router", "worker", "api", "ops", "examples")
#: Prints, from inside the image, the SHA-256 of every module of the installed packages.
HASH_MODULES = f"""
import hashlib, json, pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
out = {{}}
for package in {PACKAGES!r}:
    for path in (site / package).rglob("*.py"):
        out[str(path.relative_to(site))] = hashlib.sha256(path.read_bytes()).hexdigest()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def image() -> str:
    name, output = built.build()
    print(f"\n{output.strip()}")
    return name


def test_make_image_tags_the_version_and_runs_reins_as_its_own_user(image: str) -> None:
    assert image.endswith(f":{VERSION}"), image
    done = built.run(image, "--version")
    assert (done.returncode, done.stdout) == (0, f"reins {VERSION}\n"), done.stderr
    inspected = subprocess.run(
        ["podman", "image", "inspect", image], capture_output=True, text=True, timeout=60
    )
    config = json.loads(inspected.stdout)[0]["Config"]
    assert config["Entrypoint"] == ["reins"]
    assert config["User"] == "10001:10001", "numeric, so runAsNonRoot can check it"
    uid = built.run(image, "-u", options=("--entrypoint", "id"))
    assert uid.stdout.strip() == "10001", uid.stderr
    # One image for the three: each command the chart runs is there.
    for command in ("api", "router", "worker"):
        helped = built.run(image, command, "--help")
        assert helped.returncode == 0 and "Usage" in helped.stdout, (command, helped.stderr)


def test_the_image_holds_this_checkouts_modules_and_nothing_else(image: str) -> None:
    done = built.run(image, "-c", HASH_MODULES, options=("--entrypoint", "python"))
    assert done.returncode == 0, done.stderr
    inside = json.loads(done.stdout)
    here = {
        str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(here) > 200
    missing = sorted(set(here) - set(inside))
    extra = sorted(set(inside) - set(here))
    changed = sorted(p for p in set(here) & set(inside) if here[p] != inside[p])
    assert (missing, extra, changed) == ([], [], []), "the image is not this checkout's build"


@pytest.fixture
def image_env(key_prefix: str) -> dict[str, str]:
    """The fleet's settings, as the chart's ConfigMap gives them: the document in Redis."""
    return {
        "REINS_KEY_PREFIX": key_prefix,
        "REINS_REDIS_URL": REDIS_URL,
        "REINS_BROKER_URL": REDIS_URL,  # same database: the prefix cleanup covers Celery's keys
        "REINS_HEARTBEAT_INTERVAL_S": "0.25",
        "REINS_HEARTBEAT_TIMEOUT_S": "3",
        "REINS_SCRIPTED_LATENCY_S": "0",
        "REINS_DRAIN_GRACE_S": "5",
        "REINS_VISIBILITY_TIMEOUT_S": "30",
        "REINS_MAX_TURN_S": "10",
    }


@pytest.fixture
def image_fleet(
    image: str, image_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> Iterator[ImageFleet]:
    fleet = ImageFleet(image, image_env, tmp_path, redis_client)
    try:
        yield fleet
    finally:
        fleet.close()


def test_the_api_a_router_and_a_worker_from_the_image_run_trajectories_to_their_end(
    image: str,
    image_fleet: ImageFleet,
    image_env: dict[str, str],
    redis_client: redis.Redis,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    document = tmp_path / "tenants.toml"
    document.write_text(fleet_document(WEIGHTS))
    document.chmod(0o644)  # the container's user reads it
    mount = f"--volume={document}:{DOCUMENT_PATH}:ro"
    applied = built.run(
        image, "config", "apply", DOCUMENT_PATH, options=(mount, *built.env_options(image_env))
    )
    assert applied.returncode == 0 and "v1 applied" in applied.stdout, applied.stderr

    image_fleet.start("worker", "w1", "--backend", BACKEND)
    image_fleet.start("router", "r1", "--admitter", "redis")
    url = start_api(image_fleet)  # on a free loopback port, ready once /readyz answers
    image_fleet.wait_ready(["w1"], ["r1"], timeout_s=120)
    orders = seed_orders(redis_client, key_prefix, 5000, 12)
    ring = KeyRing(redis_client, key_prefix)
    scopes = {Scope.SUBMIT, Scope.READ}
    clients = {t: ReinsClient(url, ring.create(t, "image-test", scopes)[0]) for t in WEIGHTS}
    try:
        ids = submit_refunds(ApiSubmits(clients), orders, list(WEIGHTS))
        store = RedisStore(redis_client, prefix=key_prefix)
        wait_all_ended(store, ids, 120, image_fleet)
        shown = {clients[t].show(tid)["state"] for t, tid in ids}
    finally:
        for client in clients.values():
            client.close()
    assert shown == {"COMPLETED"}, "as the API shows them"

    records = [store.load(t, i) for t, i in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * len(ids)
    effects = effects_by_order(RedisState(redis_client, key_prefix, seed=False).effects())
    assert {order_of(r): effects[order_of(r)] for r in records} == {
        oid: Counter(refund=1, email=1) for oid in orders
    }
    assert sent_twice(redis_client, key_prefix) == {}
    admitters = Counter(e["r"] for e in Feed(redis_client, key_prefix).admissions())
    assert admitters["r1"] >= 1 and set(admitters) <= {"r1", "w1"}, admitters
    # SIGTERM reaches reins as PID 1 of its container: each drains and exits 0.
    assert stop_all(image_fleet) == {"api": 0, "r1": 0, "w1": 0}


class ApiSubmits:
    """Submissions through the API, each with its tenant's key (what submit_refunds needs)."""

    def __init__(self, clients: dict[str, ReinsClient]) -> None:
        self.clients = clients

    def submit(self, tenant: str, body: dict[str, Any]) -> Any:
        return SimpleNamespace(trajectory_id=self.clients[tenant].submit(body)["trajectory_id"])
