"""Running the fleet's real processes from a test: start, submit, wait, measure, stop.

The test process plays the router's trusted caller (the HTTP API of a later issue): it submits
and sends control requests through :class:`router.process.submit.RouterApi`, on the same Redis.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

from examples.support_store.state import RedisState
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.states import TERMINAL
from ops.local.fleet import LocalFleet
from router.process.service import AdmitterKind, RouterOptions, RouterService
from router.process.submit import RouterApi
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.fleet.conftest import WEIGHTS
from tests.support import wait_for

BACKEND = "ops.cli.fleet:support_store_redis"
#: The support store as a service that cannot de-duplicate: a write sent twice runs twice.
UNDEDUPLICATED = "tests.fleet.faults:undeduplicated_store"
#: The workers' look-up before a write off: what keeps a write single in the fault tests is
#: then the kernel's own discipline (register before send, look up a recovered write), so a
#: build that breaks it fails them; the look-up is a net for a store that lost commits.
KERNEL_ALONE = {"REINS_LOOK_UP_BEFORE_WRITE": "false"}
#: The settings of a fleet whose store's Redis fails under it: quick heartbeats and Redis
#: timeouts, model calls of 1 s (turns in flight), a broker visibility timeout past the test's
#: end (every recovery is reins's own).
STORE_FAULT_ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_MAX_TURN_S": "3",
    "REINS_STALL_TIMEOUT_S": "4",
    "REINS_SCRIPTED_LATENCY_S": "1.0",
    "REINS_REDIS_TIMEOUT_S": "1.5",
    "REINS_REDIS_CONNECT_TIMEOUT_S": "1",
}
#: An order total with room for three of the agent's 3,000-cent refunds, so a refund sent twice
#: is not refused by the store's own rule and shows in the effects.
ROOMY_TOTAL = 9_000


def start(
    fleet: LocalFleet,
    *,
    admitter: str = "redis",
    gates: Path | None = None,
    workers: Iterable[str] = ("w1", "w2"),
    routers: Iterable[str] = ("r1", "r2"),
    worker_args: Iterable[str] = (),
    env: dict[str, str] | None = None,
    backend: str = BACKEND,
) -> None:
    """Start workers and routers and wait until every router's ring holds every worker."""
    workers, routers = list(workers), list(routers)
    for w in workers:
        fleet.start("worker", w, "--backend", backend, *worker_args, env=env)
    for r in routers:
        args = ["--admitter", admitter] + (["--gates", str(gates)] if gates else [])
        fleet.start("router", r, *args, env=env)
    fleet.wait_ready(workers, routers)


def caller_api(
    fleet_env: dict[str, str], client: redis.Redis, admitter: str, gates: Path | None
) -> RouterApi:
    """The router functions, as the trusted caller in this process uses them."""
    settings = Settings.from_env(fleet_env)
    options = RouterOptions(
        name="test-caller",
        tenants_file=settings.tenants_file,
        gates_file=str(gates) if gates else "",
        admitter=AdmitterKind(admitter),
    )
    return RouterService(settings, options, client=client).api()


def wait_all_ended(
    store: RedisStore, ids: list[tuple[str, str]], timeout_s: float, fleet: LocalFleet
) -> None:
    """Poll the state index (not every record) until each trajectory is terminal."""
    wanted = {tid for _, tid in ids}

    def ended() -> bool:
        fleet._check_alive()
        done: set[str] = set()
        for tenant in WEIGHTS:
            for state in TERMINAL:
                done.update(store.list(tenant, state))
        return wanted <= done

    try:
        wait_for(ended, timeout_s, f"{len(ids)} trajectories to end", every_s=0.2)
    except TimeoutError as exc:
        stuck = []
        for tenant, tid in ids:
            rec = store.load(tenant, tid)
            if rec.state not in TERMINAL:
                stuck.append(f"{tid} {rec.state.value} v{rec.record_version} turn {rec.turn}")
        raise TimeoutError(f"{exc}; {len(stuck)} not ended: {stuck[:20]}") from None


def shares(feed: Feed) -> tuple[dict[str, float], int, Counter[str]]:
    """Each tenant's share of the charge admitted while every tenant had READY work; how many
    such admissions; and which routers admitted."""
    charge: dict[str, int] = defaultdict(int)
    counted = 0
    routers: Counter[str] = Counter()
    for entry in feed.admissions():
        routers[entry["r"]] += 1
        if entry["b"]:
            charge[entry["t"]] += entry["c"]
            counted += 1
    total = sum(charge.values()) or 1
    return {t: charge[t] / total for t in WEIGHTS}, counted, routers


def weight_shares() -> dict[str, float]:
    total = sum(WEIGHTS.values())
    return {t: w / total for t, w in WEIGHTS.items()}


def largest_gap_pp(measured: dict[str, float]) -> float:
    """The largest gap, in percentage points, between a tenant's share and its weight share."""
    target = weight_shares()
    return max(abs(measured[t] - target[t]) * 100 for t in WEIGHTS)


def effects_by_order(effects: list[list[Any]]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for effect in effects:
        out[str(effect[1])][str(effect[0])] += 1
    return out


def sent_twice(client: redis.Redis, prefix: str) -> dict[str, Any]:
    """What the shared support store shows of writes reins sent more than once: write
    attempts beyond one per key (counted as the store received them, refused ones included)
    and orders with more than one refund or e-mail. Empty when every write went once."""
    state = RedisState(client, prefix, seed=False)
    attempts = {k: n for k, n in state.write_attempts().items() if n > 1}
    effects = effects_by_order(state.effects())
    orders = {o: dict(c) for o, c in effects.items() if c["refund"] > 1 or c["email"] > 1}
    return {"attempts": attempts, "orders": orders} if attempts or orders else {}


def over_allowance(rec: TrajectoryRecord) -> list[str]:
    """The ledger accounts of ``rec`` whose actual plus reserved passed the allowance."""
    led = rec.ledger
    accounts = {"steps": led.steps, "tool_calls": led.tool_calls, "tokens": led.tokens}
    out = [n for n, a in accounts.items() if a.actual + a.reserved > a.allowance]
    d = led.dollars
    return out + (["dollars"] if d.actual + d.reserved > d.allowance else [])


def order_of(rec: TrajectoryRecord) -> str:
    return rec.goal.rsplit(" ", 1)[-1]


def stop_all(fleet: LocalFleet) -> dict[str, int]:
    """SIGTERM every process still running; their exit codes (routers first)."""
    codes = {}
    for name in sorted(fleet.procs, key=lambda n: (not n.startswith("r"), n)):
        if fleet.procs[name].poll() is None:
            codes[name] = fleet.stop(name)
    return codes


def wait_admissions(feed: Feed, at_least: int, timeout_s: float) -> None:
    wait_for(lambda: len(feed.admissions()) >= at_least, timeout_s, f"{at_least} admissions")


def now() -> float:
    return time.monotonic()
