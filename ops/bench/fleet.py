"""``reins bench fleet``: turns per second through the whole fleet, beside Celery doing nothing.

Two routers and two workers as local processes on the machine's Redis, a scripted model, tools
that take no time. The broker is the store's Redis (``REINS_BROKER_URL``) or, with
``--broker amqp``, RabbitMQ (``REINS_BROKER_URL`` when it is an AMQP URL, else the local
server as guest); the baseline goes through the same broker. The fields and the method are
described in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import tempfile
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import redis

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import MemoryState
from kernel.agent import AgentModule
from kernel.budget import Budget
from kernel.errors import InvalidInput
from kernel.settings import Settings
from kernel.states import TERMINAL, StopReason
from ops.bench.peers import Peer, installed
from ops.local.fleet import LocalFleet, process_cpu_s, wait_for
from router.fleet import config as fleet_config
from router.process.service import SEND_BURST, RouterOptions, RouterService
from router.process.submit import RouterApi
from router.wire.amqp import delete_queues
from router.wire.broker import (
    NOOP_TASK,
    BrokerKind,
    broker_keyprefix,
    broker_kind,
    celery_queue,
    make_app,
    noops_key,
    queue_for,
)
from router.wire.feed import Feed
from router.wire.publishers import publisher_for
from store.redis_client import text

TENANTS = ("acme", "globex", "initech")
ORDERS = {
    f"ord_{n}": {"customer": "cu_ana", "total": 9000, "refunded": 0, "status": "delivered"}
    for n in range(100, 140)
}
ROUNDS = 3  # noop and zero-latency phases, alternating
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672//"
WORKERS = ("w1", "w2")
BUDGET = Budget(
    max_steps=40,
    max_tool_calls=40,
    max_tokens=200_000,
    deadline_s=600,
    max_cost=Decimal("10"),
    max_stalls=5,
)


class ProbePolicy:
    """Reads N orders one turn at a time (``get_order``), then answers: N + 1 turns.

    The goal says how many (``probe 10 orders``); every turn learns new facts, so progress is
    real and no limit ends the run early.
    """

    def __init__(self, count: int, latency: float) -> None:
        self.count, self.latency = count, latency

    def __call__(self, view: dict[str, Any], i: int) -> tuple[dict[str, Any], float]:
        known = sum(1 for k in view["facts"] if k.endswith(".total_cents"))
        if known < self.count:
            args = {"order_id": f"ord_{100 + known}"}
            return {"type": "tool", "name": "get_order", "args": args}, self.latency
        return {"type": "final", "outcome": "completed", "text": "probed"}, self.latency


def _policy(latency: float) -> Any:
    def make(goal: str) -> ProbePolicy:
        found = re.search(r"probe (\d+)", goal)
        return ProbePolicy(int(found.group(1)) if found else 10, latency)

    return make


def _backend() -> SupportStoreBackend:
    return SupportStoreBackend(MemoryState(ORDERS))


_base = make_agent("fleet_bench", budget=BUDGET).profile
fast_agent = AgentModule(profile=_base, make_backend=_backend, make_policy=_policy(0.0))
slow_agent = AgentModule(profile=_base, make_backend=_backend, make_policy=_policy(1.0))


def _broker_url(base: Settings, broker: str) -> str:
    """The URL of the broker the run measures (``broker``: redis or amqp)."""
    try:
        wanted = BrokerKind(broker)
    except ValueError:
        raise InvalidInput(f"--broker: redis or amqp, got {broker!r}") from None
    if broker_kind(base.broker_url) is wanted:
        return base.broker_url
    return LOCAL_AMQP if wanted is BrokerKind.AMQP else base.redis_url


def peer(broker: str = "redis") -> Peer:
    """Celery running no-op tasks: the same workers, broker and publisher as the turns."""
    sent = (
        "kombu's producer on a channel in confirm mode, RabbitMQ"
        if broker == BrokerKind.AMQP.value
        else "written onto kombu's list in one pipeline a burst, Redis"
    )
    return Peer(
        name="Celery no-op tasks",
        version=installed("celery"),
        path=f"published by the routers' publisher in bursts of {SEND_BURST} ({sent}; kombu "
        f"{installed('kombu')}), run by the same two Celery worker processes as the turns",
    )


def run(quick: bool = False, broker: str = "redis") -> dict[str, Any]:
    """Start the fleet, run the three phases, end every process, clean the keys (and, on
    RabbitMQ, the queues of this run)."""
    env_base = Settings.from_env(os.environ)
    base = env_base.model_copy(update={"broker_url": _broker_url(env_base, broker)})
    amqp = broker_kind(base.broker_url) is BrokerKind.AMQP
    prefix = f"reins-bench-{uuid.uuid4().hex[:10]}"
    store_client = redis.Redis.from_url(base.redis_url)
    broker_client = store_client if amqp else redis.Redis.from_url(base.broker_url)
    with tempfile.TemporaryDirectory(prefix="reins-bench-fleet-") as tmp:
        document = Path(tmp) / "fleet.toml"
        document.write_text(_document_toml())
        # As the chart and `reins up` configure a fleet: the document in Redis, no tenants
        # file, so every router and worker (follow-on turns too) reads it.
        version = fleet_config.apply(store_client, prefix, fleet_config.read_file(document))
        env = {
            "REINS_KEY_PREFIX": prefix,
            "REINS_REDIS_URL": base.redis_url,
            "REINS_BROKER_URL": base.broker_url,
            "REINS_WORKER_CONCURRENCY": "192",
            "REINS_HEARTBEAT_INTERVAL_S": "0.5",
        }
        fleet = LocalFleet(env, Path(tmp), store_client)
        try:
            for w in WORKERS:
                fleet.start("worker", w, "--log-level", "WARNING")
            for r in ("r1", "r2"):
                fleet.start("router", r, "--log-level", "WARNING")
            fleet.wait_ready(list(WORKERS), ["r1", "r2"])
            settings = base.model_copy(update={"key_prefix": prefix, "tenants_file": ""})
            return {
                "peer": peer(broker_kind(base.broker_url).value).as_json(),
                "broker": broker_kind(base.broker_url).value,
                "configured_by": f"fleet document v{version}",
                **_phases(settings, store_client, broker_client, fleet, quick),
            }
        finally:
            fleet.close()
            if amqp:
                named = base.model_copy(update={"key_prefix": prefix})
                delete_queues(named, [celery_queue(named, w) for w in WORKERS])
            for client in {
                id(store_client): store_client,
                id(broker_client): broker_client,
            }.values():
                keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
                keys += list(client.scan_iter(match=f"{{{prefix}*", count=1000))
                if keys:
                    client.delete(*keys)


def _phases(
    settings: Settings, client: redis.Redis, broker: redis.Redis, fleet: LocalFleet, quick: bool
) -> dict[str, Any]:
    service = RouterService(
        settings,
        RouterOptions(name="bench", tenants_file=""),
        client=client,
        sender=lambda member, payload: None,
    )
    api, feed = service.api(), Feed(client, settings.key_prefix)
    rounds, noops, fast_n = (1, 600, 90) if quick else (ROUNDS, 1500, 90)
    probes = 4 if quick else 10
    redis_pid = int(client.info("server").get("process_id", 0)) if _local(settings) else 0
    amqp = broker_kind(settings.broker_url) is BrokerKind.AMQP
    cpu = _Cpu(fleet, redis_pid, _rabbitmq_pid() if amqp else 0)
    noop_rates, step_rates, ratios, fasts = [], [], [], []
    noop_cpu, fast_cpu = [0.0] * 4, [0.0] * 4  # routers, workers, Redis, RabbitMQ
    for _ in range(rounds):  # side by side, alternating, so the machine's drift hits both
        noop_rates.append(_noops(settings, broker, noops))
        noop_cpu = [a + b for a, b in zip(noop_cpu, cpu.lap(), strict=True)]
        fast = _phase(api, feed, "ops.bench.fleet:fast_agent", fast_n, probes)
        fast_cpu = [a + b for a, b in zip(fast_cpu, cpu.lap(), strict=True)]
        step_rates.append(fast["rate"])
        ratios.append(fast["rate"] / noop_rates[-1])
        fasts.append(fast)
    slow = _phase(api, feed, "ops.bench.fleet:slow_agent", 200, probes)
    steps = sum(f["steps"] for f in fasts)
    noop_ms = sum(noop_cpu[1:]) * 1000 / (noops * rounds)  # workers, Redis, RabbitMQ
    step_ms = sum(fast_cpu) * 1000 / steps  # the routers' too: they admit and send turns
    return {
        "quick": quick,
        "workers": 2,
        "routers": 2,
        "rounds": rounds,
        "celery_noop_per_s": round(statistics.median(noop_rates), 1),
        "celery_noop_per_s_rounds": [round(r, 1) for r in noop_rates],
        "celery_noops": noops * rounds,
        "steps_per_s": round(statistics.median(step_rates), 1),
        "steps_per_s_rounds": [round(r, 1) for r in step_rates],
        "steps": steps,
        "cpu_ratio": round(statistics.median(ratios), 3),
        "cpu_ratio_rounds": [round(r, 3) for r in ratios],
        "cpu_cost_ratio": round(noop_ms / step_ms, 3) if step_ms > 0 else math.nan,
        "latency_concurrent_trajectories": 200,
        "latency_model_s": 1.0,
        "latency_steps_per_s": round(slow["rate"], 1),
        "latency_steps_per_s_overall": round(slow["overall"], 1),
        "latency_efficiency": round(slow["rate"] / 200.0, 3),
        "latency_efficiency_overall": round(slow["overall"] / 200.0, 3),
        "p99_admission_to_start_ms": round(slow["p99_start_ms"], 2),
        "p50_admission_to_start_ms": round(slow["p50_start_ms"], 2),
        "p99_admission_to_start_ms_saturated": round(
            statistics.median(f["p99_start_ms"] for f in fasts), 2
        ),
        "follow_on_share": round(statistics.median(f["follow_on"] for f in fasts), 3),
        "follow_on_share_latency": round(slow["follow_on"], 3),
        "unfinished": sum(f["unfinished"] for f in fasts) + slow["unfinished"],
        "worker_cpu_ms_per_noop": round(noop_cpu[1] * 1000 / (noops * rounds), 3),
        "redis_cpu_ms_per_noop": round(noop_cpu[2] * 1000 / (noops * rounds), 3),
        "worker_cpu_ms_per_step": round(fast_cpu[1] * 1000 / steps, 3),
        "router_cpu_ms_per_step": round(fast_cpu[0] * 1000 / steps, 3),
        "redis_cpu_ms_per_step": round(fast_cpu[2] * 1000 / steps, 3),
        **(
            {
                "rabbitmq_cpu_ms_per_noop": round(noop_cpu[3] * 1000 / (noops * rounds), 3),
                "rabbitmq_cpu_ms_per_step": round(fast_cpu[3] * 1000 / steps, 3),
            }
            if cpu.broker_pid
            else {}
        ),
    }


def _local(settings: Settings) -> bool:
    """True when the store's Redis runs on this machine (its CPU is then counted)."""
    return any(h in settings.redis_url for h in ("127.0.0.1", "localhost"))


def _rabbitmq_pid() -> int:
    """The PID of this machine's RabbitMQ (its Erlang VM), or 0 when none runs here."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if (proc / "comm").read_text().strip() != "beam.smp":
                continue
            if b"rabbit" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except OSError:
            continue
    return 0


class _Cpu:
    """CPU seconds of the routers, the workers, the Redis server and (when it runs here) the
    RabbitMQ server between laps."""

    def __init__(self, fleet: LocalFleet, redis_pid: int, broker_pid: int) -> None:
        self.fleet, self.redis_pid, self.broker_pid = fleet, redis_pid, broker_pid
        self.last = self._read()

    def _read(self) -> tuple[float, ...]:
        return (
            self.fleet.cpu_s("r1", "r2"),
            self.fleet.cpu_s(*WORKERS),
            process_cpu_s(self.redis_pid) if self.redis_pid else 0.0,
            process_cpu_s(self.broker_pid) if self.broker_pid else 0.0,
        )

    def lap(self) -> tuple[float, ...]:
        now = self._read()
        out = tuple(b - a for a, b in zip(self.last, now, strict=True))
        self.last = now
        return out


def _noops(settings: Settings, broker: redis.Redis, count: int) -> float:
    """No-op tasks through the publisher the routers use, in bursts of 16 as they send."""
    batch = publisher_for(settings, make_app(settings), broker)
    if broker_kind(settings.broker_url) is BrokerKind.AMQP:
        return _amqp_noops(settings, broker, batch, count)
    kp = broker_keyprefix(settings)
    keys = [kp + queue_for(w) for w in WORKERS]

    def empty() -> bool:
        pipe = broker.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        pipe.hlen(kp + "unacked")
        return int(sum(pipe.execute())) == 0

    start = time.perf_counter()
    _publish_noops(batch, count)
    wait_for(empty, 300, "the no-op tasks to drain", every_s=0.005)
    return count / (time.perf_counter() - start)


def _publish_noops(batch: Any, count: int) -> None:
    for i in range(count):
        batch.add(NOOP_TASK, "w1" if i % 2 else "w2")
        if len(batch.pending) >= SEND_BURST:
            batch.flush()
    batch.flush()


def _amqp_noops(settings: Settings, client: redis.Redis, batch: Any, count: int) -> float:
    """RabbitMQ does not say when its last message was acknowledged: the workers tell how many
    no-ops they ran and when the last one ran (``noops_key``), and the rate is taken to it."""
    key = noops_key(settings.key_prefix)

    def tally() -> tuple[int, float]:
        told = [text(v).split(":") for v in client.hvals(key)]
        return sum(int(n) for n, _ in told), max((float(t) for _, t in told), default=0.0)

    before = tally()[0]
    start = time.time()
    _publish_noops(batch, count)
    wait_for(lambda: tally()[0] >= before + count, 300, "the no-op tasks to run", every_s=0.01)
    return count / max(tally()[1] - start, 1e-9)


def _phase(
    api: RouterApi, feed: Feed, agent: str, trajectories: int, probes: int
) -> dict[str, Any]:
    admitted_before, starts_before = len(feed.admissions()), len(feed.starts())
    begin = time.time()
    ids = []
    for i in range(trajectories):
        tenant = TENANTS[i % len(TENANTS)]
        job = {"agent": agent, "goal": f"probe {probes} orders", "user": "cu_ana"}
        ids.append((tenant, api.submit(tenant, job).trajectory_id))
    store = api.store
    wanted = {i for _, i in ids}

    def ended() -> bool:  # from the state index: a poll must not load every record
        done = set()
        for tenant in TENANTS:
            for state in TERMINAL:
                done.update(store.list(tenant, state))
        return wanted <= done

    wait_for(ended, 600, f"{trajectories} trajectories of {agent} to end", every_s=0.1)
    end = time.time()
    time.sleep(1.2)  # two worker heartbeats: the last admission-to-start delays are reported
    records = [store.load(t, i) for t, i in ids]
    admissions = feed.admissions()[admitted_before:]
    at = sorted(a["at"] for a in admissions)
    lo, hi = at[len(at) // 10], at[(len(at) * 9) // 10]
    delays = sorted(feed.starts()[starts_before:])
    return {
        "steps": sum(r.turn for r in records),
        "rate": (len(at) * 0.8) / max(hi - lo, 1e-9),
        "overall": sum(r.turn for r in records) / max(end - begin, 1e-9),
        "follow_on": sum(1 for a in admissions if a["r"] in WORKERS) / max(len(admissions), 1),
        "p99_start_ms": _quantile(delays, 0.99),
        "p50_start_ms": _quantile(delays, 0.50),
        "unfinished": sum(
            1 for r in records if r.stop_reason is None or r.stop_reason is not StopReason.DONE
        ),
    }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


def _document_toml() -> str:
    """The fleet's document: three tenants weighted 3:2:1, each listing the bench's agents."""
    agents = '["ops.bench.fleet:fast_agent", "ops.bench.fleet:slow_agent"]'
    blocks = [
        "quantum_tokens = 4000\ncredit_cap_tokens = 40000\n",
        *(
            f'[[tenants]]\nname = "{name}"\nweight = {w}\nmax_ready = 100000\n'
            f"largest_call_tokens = 20000\nagents = {agents}\n"
            for name, w in zip(TENANTS, (3, 2, 1), strict=True)
        ),
    ]
    return "\n".join(blocks)
