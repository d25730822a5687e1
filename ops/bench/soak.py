"""``reins bench soak``: a fleet under steady load for N minutes while faults come on a schedule.

Two routers, three workers and the API as local processes; the store and the broker on a
redis-server of the run's own with ``appendfsync everysec`` (Redis's default); the tool backend
is the support store as a service that cannot de-duplicate and answers a write 0.3 s after its
effect (so a fault in that window leaves an outcome to recover), its state on the machine's Redis
(another system, which keeps what the fleet's Redis loses). Three tenants (weights 3:2:1)
submit refunds through the API at a steady rate, each order with room for a second refund.
Every ``minutes * 60 / faults`` seconds the next fault of a cycle comes: a worker SIGKILLed
(and started again), a worker drained (SIGTERM) and replaced, a router SIGKILLed and started
again, Redis SIGKILLed and started again, every client connection of Redis dropped (the
broker's included), a worker SIGSTOPped for ten seconds and continued (a zombie). Then the run
waits for every trajectory to end and reports: trajectories, faults injected, lost (never
terminal), duplicated writes (writes past their fence beyond one per key), wrongly refused
writes (a run whose write its own newer attempt did not shut out, yet was refused by a fence),
trajectories stuck longer than :data:`STUCK_AFTER_S` (the stated recovery bound: no chain row
for that long while live), p50 and p99 from submission to end, and each tenant's share of the
admitted charge against its weight. The worker's look-up before a write
(``REINS_LOOK_UP_BEFORE_WRITE``, on by default) follows the caller's setting: with it off, the
soak shows what the kernel's recovery rule alone keeps. The method is in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from api.client import ReinsClient
from api.keys import KeyRing, Scope
from examples.support_store.backend import WRITES, SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.agent import AgentModule
from kernel.chain import ChainRow, RowKind
from kernel.settings import Settings
from kernel.states import TERMINAL
from kernel.tools import FENCED
from ops.bench.peers import Peer, none
from ops.local.cluster import free_ports
from ops.local.fleet import LocalFleet, wait_for
from router.fleet import config as fleet_config
from router.wire.feed import Feed
from store.redis_store import RedisStore

AGENT = "examples.support_store:agent_lookup"
ROUTE = "scripted/refund-policy"
BACKEND = "ops.bench.soak:external_store"
BACKEND_URL_VAR = "SOAK_BACKEND_REDIS_URL"  # not a REINS_ setting: the backend's own system
WEIGHTS = {"acme": 3, "globex": 2, "initech": 1}
ORDER_TOTAL = 9_000  # room for three 3,000-cent refunds
ANSWER_S = 0.3  # a write's answer comes this long after its effect
STUCK_AFTER_S = 120.0  # the stated recovery bound: a live run with no chain row this long
FAULTS = ("worker_kill", "drain_replace", "router_kill", "redis_restart", "drop_clients", "zombie")
ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.5",
    "REINS_HEARTBEAT_TIMEOUT_S": "3",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_MAX_TURN_S": "10",
    "REINS_STALL_TIMEOUT_S": "15",
    "REINS_DRAIN_GRACE_S": "10",
    "REINS_SCRIPTED_LATENCY_S": "0.5",
    "REINS_WORKER_CONCURRENCY": "32",
    "REINS_REDIS_TIMEOUT_S": "2",
    "REINS_REDIS_CONNECT_TIMEOUT_S": "1",
    "REINS_OWED_AFTER_S": "5",
}


class _AnswersLate(SupportStoreBackend):
    """The support store, whose writes answer :data:`ANSWER_S` after they took effect, as over
    a network: a fault in that window leaves an effect whose outcome the run does not know."""

    def call(
        self,
        user: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout_s: float,
        approval: str | None = None,
        *,
        fence: int,
    ) -> tuple[dict[str, Any], float]:
        result = super().call(user, tool, args, key, timeout_s, approval, fence=fence)
        if tool in WRITES:
            time.sleep(ANSWER_S)
        return result


def external_store(agent: AgentModule, settings: Settings, client: redis.Redis) -> Any:
    """The support store as a service that cannot de-duplicate and answers writes late, on the
    Redis at :data:`BACKEND_URL_VAR` (a worker's ``--backend``)."""
    own = redis.Redis.from_url(os.environ[BACKEND_URL_VAR])
    return _AnswersLate(RedisState(own, settings.key_prefix, deduplicate=False))


class _Redis:
    """The fleet's redis-server: AOF everysec in a directory of its own, on a free port."""

    def __init__(self, directory: Path) -> None:
        self.dir, self.port = directory, free_ports(1)[0]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.dir), "--appendonly", "yes", "--appendfsync", "everysec"]
        args += ["--save", "", "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(args)
        probe = redis.Redis.from_url(self.url, socket_timeout=1)

        def up() -> bool:
            try:
                return bool(probe.ping())
            except redis.ConnectionError:
                return False

        wait_for(up, 30, "the soak's redis-server to come up")
        probe.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class _Faults:
    """The schedule's faults, each on the processes this run started (by PID)."""

    def __init__(self, fleet: LocalFleet, server: _Redis, client: redis.Redis) -> None:
        self.fleet, self.server, self.client = fleet, server, client
        self.injected: Counter[str] = Counter()
        self._workers = itertools.cycle(("w1", "w2", "w3"))
        self._spares = itertools.count(4)

    def inject(self, kind: str) -> None:
        getattr(self, f"_{kind}")()
        self.injected[kind] += 1

    def _live_worker(self) -> str:
        for _ in range(16):
            name = next(self._workers)
            if name in self.fleet.procs and self.fleet.procs[name].poll() is None:
                return name
        raise RuntimeError("no live worker to fault")

    def _worker_kill(self) -> None:
        name = self._live_worker()
        self.fleet.kill(name)
        self.fleet.start("worker", name, "--backend", BACKEND, "--log-level", "WARNING")

    def _drain_replace(self) -> None:
        name = self._live_worker()
        self.fleet.stop(name)  # SIGTERM: drains, hands back what it has not started
        self.fleet.start("worker", name, "--backend", BACKEND, "--log-level", "WARNING")

    def _router_kill(self) -> None:
        self.fleet.kill("r1")
        self.fleet.start("router", "r1", "--admitter", "redis", "--log-level", "WARNING")

    def _redis_restart(self) -> None:
        self.server.kill()
        self.server.start()

    def _drop_clients(self) -> None:
        self.client.client_kill_filter(_type="normal", skipme=True)

    def _zombie(self) -> None:
        pid = self.fleet.procs[self._live_worker()].pid
        os.kill(pid, signal.SIGSTOP)
        time.sleep(10.0)  # the pause is the fault: silent, alive, then back
        os.kill(pid, signal.SIGCONT)


def peer() -> Peer:
    """None: the soak is judged against stated bounds, not beside another system."""
    return none(
        "stated bounds: no run lost, no write duplicated past its fence, none stuck past "
        f"{STUCK_AFTER_S:.0f} s, the tenants' shares against their weights"
    )


def run(minutes: float = 10.0, quick: bool = False) -> dict[str, Any]:
    """Run the soak (``quick``: two minutes, six faults) and report its figures."""
    base = Settings.from_env(os.environ)
    minutes = 2.0 if quick else minutes
    prefix = f"reins-soak-{uuid.uuid4().hex[:10]}"
    backend_client = redis.Redis.from_url(base.redis_url)
    with tempfile.TemporaryDirectory(prefix="reins-bench-soak-") as tmp:
        (Path(tmp) / "redis").mkdir()
        server = _Redis(Path(tmp) / "redis")
        server.start()
        client = redis.Redis.from_url(server.url)
        try:
            with _fleet(server, prefix, base, Path(tmp), client) as (fleet, port, keys):
                figures = _soak(fleet, server, client, backend_client, prefix, port, keys, minutes)
            return {
                "peer": peer().as_json(),
                "quick": quick,
                "minutes": minutes,
                "look_up_before_write": base.look_up_before_write,
                **figures,
            }
        finally:
            server.kill()
            keys_left = list(backend_client.scan_iter(match=f"{prefix}*", count=1000))
            if keys_left:
                backend_client.delete(*keys_left)


@contextmanager
def _fleet(
    server: _Redis, prefix: str, base: Settings, tmp: Path, client: redis.Redis
) -> Iterator[tuple[LocalFleet, int, dict[str, str]]]:
    """The document applied, a key per tenant, and every process started; all ended after."""
    fleet_config.apply(client, prefix, _document())
    ring = KeyRing(client, prefix)
    keys = {t: ring.create(t, "soak", {Scope.SUBMIT, Scope.READ})[0] for t in WEIGHTS}
    port = free_ports(1)[0]
    env = {
        **ENV,
        "REINS_KEY_PREFIX": prefix,
        "REINS_REDIS_URL": server.url,
        "REINS_BROKER_URL": server.url,
        # The caller's choice: off, the soak shows what the kernel's recovery rule alone keeps.
        "REINS_LOOK_UP_BEFORE_WRITE": "true" if base.look_up_before_write else "false",
        BACKEND_URL_VAR: base.redis_url,
    }
    (tmp / "logs").mkdir()
    fleet = LocalFleet(env, tmp / "logs", client)
    try:
        for w in ("w1", "w2", "w3"):
            fleet.start("worker", w, "--backend", BACKEND, "--log-level", "WARNING")
        for r in ("r1", "r2"):
            fleet.start("router", r, "--admitter", "redis", "--log-level", "WARNING")
        fleet.start("api", "api", "--port", str(port), "--log-level", "WARNING")
        fleet.wait_ready(["w1", "w2", "w3"], ["r1", "r2"])
        yield fleet, port, keys
    finally:
        fleet.close()


def _document() -> dict[str, Any]:
    return {
        "quantum_tokens": 1000,
        "credit_cap_tokens": 12000,
        "tenants": [
            {
                "name": name,
                "weight": weight,
                "max_ready": 100_000,
                "largest_call_tokens": 8000,
                "agents": [AGENT],
            }
            for name, weight in WEIGHTS.items()
        ],
        # The provider's concurrency is the bottleneck, so the tenants' backlogs build up and
        # the round-robin's shares are exercised while the faults come.
        "gates": {"routes": {ROUTE: {"concurrency": 12, "lease_ttl_s": 20}}},
    }


def _soak(
    fleet: LocalFleet,
    server: _Redis,
    client: redis.Redis,
    backend: redis.Redis,
    prefix: str,
    port: int,
    keys: dict[str, str],
    minutes: float,
) -> dict[str, Any]:
    faults = _Faults(fleet, server, client)
    submitted: list[tuple[str, str, float]] = []
    stop = threading.Event()
    submitter = threading.Thread(
        target=_submit, args=(port, keys, backend, prefix, submitted, stop), daemon=True
    )
    began = time.monotonic()
    submitter.start()
    count = max(len(FAULTS), round(minutes * 2))  # at least one of each; about two a minute
    every = minutes * 60 / (count + 1)
    for kind in itertools.islice(itertools.cycle(FAULTS), count):
        _sleep_until(began, every * (sum(faults.injected.values()) + 1))
        faults.inject(kind)
    _sleep_until(began, minutes * 60)
    stop.set()
    submitter.join()
    store = RedisStore(client, prefix=prefix)
    lost = _wait_ended(store, submitted, timeout_s=600)
    return {
        "trajectories": len(submitted),
        "faults_injected": sum(faults.injected.values()),
        "faults": dict(faults.injected),
        **_figures(store, client, backend, prefix, submitted, lost),
    }


def _sleep_until(began: float, at_s: float) -> None:
    left = began + at_s - time.monotonic()
    if left > 0:
        time.sleep(left)


def _submit(
    port: int,
    keys: dict[str, str],
    backend: redis.Redis,
    prefix: str,
    submitted: list[tuple[str, str, float]],
    stop: threading.Event,
) -> None:
    """About four refunds a second, the tenants in turn; a submission refused or failed (the
    API's Redis restarting) is dropped, and the next one comes a moment later."""
    clients = {t: ReinsClient(f"http://127.0.0.1:{port}", k) for t, k in keys.items()}
    tenants = itertools.cycle(WEIGHTS)
    orders = itertools.count(10_000)
    while not stop.wait(0.25):
        tenant, n = next(tenants), next(orders)
        oid = f"ord_{n}"
        order = {"customer": "cu_ana", "total": ORDER_TOTAL, "refunded": 0, "status": "delivered"}
        backend.set(f"{prefix}:store:order:{oid}", json.dumps(order))
        job = {"agent": AGENT, "goal": f"refund the damaged item on order {oid}", "user": "cu_ana"}
        try:
            done = clients[tenant].submit(job, idempotency_key=f"soak-{n}")
        except Exception:  # the API or its Redis is away this instant: the next round
            continue
        submitted.append((tenant, done["trajectory_id"], time.time()))
    for c in clients.values():
        c.close()


def _wait_ended(
    store: RedisStore, submitted: list[tuple[str, str, float]], timeout_s: float
) -> set[str]:
    """Wait until every trajectory is terminal (bounded); the ids that never were."""
    wanted = {tid for _, tid, _ in submitted}

    def ended() -> set[str]:
        done: set[str] = set()
        for tenant in WEIGHTS:
            for state in TERMINAL:
                try:
                    done.update(store.list(tenant, state))
                except Exception:
                    return set()
        return wanted - done

    try:
        wait_for(lambda: not ended(), timeout_s, "every trajectory to end", every_s=1.0)
    except TimeoutError:
        return ended()
    return set()


def _figures(
    store: RedisStore,
    client: redis.Redis,
    backend: redis.Redis,
    prefix: str,
    submitted: list[tuple[str, str, float]],
    lost: set[str],
) -> dict[str, Any]:
    state = RedisState(backend, prefix, seed=False)
    duplicated = sum(n - 1 for n in state.write_attempts().values() if n > 1)
    took, stuck, refused, stops = [], 0, 0, Counter[str]()
    for tenant, tid, at in submitted:
        if tid in lost:
            continue
        rec = store.load(tenant, tid)
        rows = store.read(tenant, tid)
        stops[rec.stop_reason.value if rec.stop_reason else "none"] += 1
        took.append(max(r.at for r in rows) - at)
        gaps = [b.at - a.at for a, b in itertools.pairwise(rows)]
        stuck += any(g > STUCK_AFTER_S for g in gaps)
        refused += _wrongly_fenced(rows)
    took.sort()
    return {
        "lost": len(lost),
        "duplicated_writes": duplicated,
        "fenced_late_writes": state.fenced_writes(),
        "wrongly_refused_writes": refused,
        "stuck_past_bound": stuck,
        "stuck_bound_s": STUCK_AFTER_S,
        "stops": dict(stops),
        "p50_submit_to_end_s": round(statistics.median(took), 2) if took else None,
        "p99_submit_to_end_s": round(took[int(0.99 * (len(took) - 1))], 2) if took else None,
        "share_error": _share_error(Feed(client, prefix)),
    }


def _wrongly_fenced(rows: list[ChainRow]) -> bool:
    """A write of the run was refused by a fence that no newer attempt of its own explains."""
    return any(
        r.kind is RowKind.TOOL and r.error == FENCED and (r.detail or {}).get("awaited")
        for r in rows
    )


def _share_error(feed: Feed) -> dict[str, Any]:
    """Per tenant: its share of the charge admitted while every tenant was backlogged (a
    tenant with nothing queued is owed no share) minus its weight share, in points; and how
    many admissions that was."""
    charge: Counter[str] = Counter()
    counted = 0
    for entry in feed.admissions():
        if entry.get("b"):
            charge[str(entry.get("t"))] += int(entry.get("c", 0))
            counted += 1
    total, weights = sum(charge.values()) or 1, sum(WEIGHTS.values())
    errors = {t: round((charge[t] / total - w / weights) * 100, 2) for t, w in WEIGHTS.items()}
    return {"backlogged_admissions": counted, "per_tenant_pp": errors}
