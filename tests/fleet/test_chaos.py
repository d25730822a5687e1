"""Chaos: a worker SIGKILLed with many turns in flight; reins's reconciler, not the broker,
carries them on.

Two runs of the same jobs side by side, each on its own key prefix, real Redis, one router, two
Celery worker processes, the support store's shared Redis backend as a service that cannot
de-duplicate and answers writes slowly, an agent whose writes declare ``lookup``, and a scripted
model that takes 1.5 s per call (so turns are in flight). In one run ``w2`` is SIGKILLed by PID
while it holds at least 50 turns and at least 3 of its writes await their answers. The
heartbeat timeout is 2 s and the broker's visibility timeout 300 s, far past the end of the
test: every recovery is the
reconciler's. The stranded trajectories end ``done`` on the surviving worker, as many end
``done`` as in the run without the crash, the backend shows one refund and one email per
``done`` trajectory, and no ledger goes over its allowance. The worst time from the dead
worker's last heartbeat to a recovery is printed (a figure, not asserted). It runs on Redis
and on RabbitMQ, where the killed worker's unacknowledged messages go back at once to its own
queue, which nobody consumes any more.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.chain import RowKind
from kernel.record import TrajectoryRecord
from kernel.states import TERMINAL, StopReason
from ops.local.fleet import LocalFleet
from router.wire.custody import Custody
from store.redis_store import RedisStore
from tests.fleet.brokers import delete_member_queues
from tests.fleet.conftest import BROKERS, WEIGHTS
from tests.fleet.faults import answering_key
from tests.fleet.harness import seed_orders, submit_refunds
from tests.fleet.processes import (
    KERNEL_ALONE,
    ROOMY_TOTAL,
    UNDEDUPLICATED,
    caller_api,
    effects_by_order,
    order_of,
    over_allowance,
    sent_twice,
    start,
    stop_all,
    wait_all_ended,
)
from tests.support import wait_for

pytestmark = [pytest.mark.redis, pytest.mark.slow]
TRAJECTORIES = 150
IN_FLIGHT_AT_KILL = 50
WRITES_AWAITED_AT_KILL = 3
CHAOS_ENV = {
    "REINS_HEARTBEAT_INTERVAL_S": "0.25",
    "REINS_HEARTBEAT_TIMEOUT_S": "2",
    "REINS_VISIBILITY_TIMEOUT_S": "300",
    "REINS_SCRIPTED_LATENCY_S": "1.5",
    "REINS_WORKER_CONCURRENCY": "48",
    # The stranded-turn backstop then counts a turn its live holder has not moved for 6 s as
    # stranded: the race that once recovered a turn twice while the survivor carried it.
    "REINS_MAX_TURN_S": "3",
    **KERNEL_ALONE,
}


class Run:
    """One fleet (one router, workers w1 and w2) and its jobs, under its own key prefix."""

    def __init__(
        self, env: dict[str, str], log_dir: Path, client: redis.Redis, prefix: str
    ) -> None:
        log_dir.mkdir(exist_ok=True)
        self.env = {**env, **CHAOS_ENV, "REINS_KEY_PREFIX": prefix}
        self.client, self.prefix = client, prefix
        self.fleet = LocalFleet(self.env, log_dir, client)
        self.store = RedisStore(client, prefix=prefix)
        self.custody = Custody(client, prefix)
        self.ids: list[tuple[str, str]] = []

    def boot(self) -> None:
        start(self.fleet, routers=("r1",), backend=UNDEDUPLICATED)

    def submit(self) -> None:
        api = caller_api(self.env, self.client, "redis", None)
        orders = seed_orders(self.client, self.prefix, 1000, TRAJECTORIES, total=ROOMY_TOTAL)
        self.ids.extend(submit_refunds(api, orders, list(WEIGHTS)))

    def recovered_rows(self, rec: TrajectoryRecord) -> int:
        """How many recoveries ``rec``'s chain records (the reconciler's and the backstop's)."""
        rows = self.store.read(rec.tenant, rec.trajectory_id)
        return sum(1 for r in rows if r.kind is RowKind.CONTROL and r.outcome == "recovered")

    def records(self) -> list[TrajectoryRecord]:
        return [self.store.load(t, i) for t, i in self.ids]

    def effects(self) -> dict[str, Counter[str]]:
        return effects_by_order(RedisState(self.client, self.prefix, seed=False).effects())


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_worker_killed_with_50_turns_in_flight_loses_nothing(
    fleet_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis, key_prefix: str
) -> None:
    crash = Run(fleet_env, tmp_path / "crash", redis_client, key_prefix)
    calm = Run(fleet_env, tmp_path / "calm", redis_client, f"{key_prefix}-calm")
    try:
        crash.boot()  # both fleets up before either run starts: w2 must still be busy after
        calm.boot()
        crash.submit()
        calm.submit()
        held: list[int] = []

        answering = answering_key(crash.prefix, crash.fleet.procs["w2"].pid)

        def w2_busy() -> bool:
            """w2 holds many turns, and some writes it carried out await their answers."""
            held[:] = [len(crash.custody.entrusted_to("w2"))]
            awaited = crash.client.hlen(answering)
            return held[0] >= IN_FLIGHT_AT_KILL and awaited >= WRITES_AWAITED_AT_KILL

        wait_for(
            w2_busy,
            60,
            f"w2 to hold {IN_FLIGHT_AT_KILL} turns, {WRITES_AWAITED_AT_KILL} awaiting a write",
            every_s=0.01,
        )
        in_flight = len(crash.custody.entrusted_to("w1")) + held[0]
        stranded = {h.trajectory_id for h in crash.custody.entrusted_to("w2")}
        crash.fleet.kill("w2")  # SIGKILL: no drain, no deregistration, no notice
        print(f"\nw2 SIGKILLed holding {held[0]} turns ({in_flight} in flight in all)")

        wait_all_ended(crash.store, crash.ids, 80, crash.fleet)
        wait_all_ended(calm.store, calm.ids, 80, calm.fleet)

        crashed, normal = crash.records(), calm.records()
        assert all(r.state in TERMINAL for r in crashed + normal)
        done = [r for r in crashed if r.stop_reason is StopReason.DONE]
        stops = Counter(r.stop_reason.value for r in crashed if r.stop_reason)
        calm_stops = Counter(r.stop_reason.value for r in normal if r.stop_reason)
        print(f"stops with the crash {dict(stops)}; without {dict(calm_stops)}")
        assert len(done) == calm_stops["done"], (stops, calm_stops)

        recoveries = crash.custody.recoveries()
        recovered = {e["trajectory_id"] for e in recoveries}
        assert recovered, "the reconciler recovered the dead worker's turns"
        assert {e["member"] for e in recoveries} == {"w2"} and {e["by"] for e in recoveries} == {
            "r1"
        }
        times = Counter(Counter(e["trajectory_id"] for e in recoveries).values())
        assert set(times) == {1}, f"each stranded turn recovered once: {times}"
        in_chains = Counter(crash.recovered_rows(r) for r in crashed)
        print(f"recoveries per trajectory, as the chains record them: {dict(in_chains)}")
        assert max(in_chains) <= 1, f"a turn recovered more than once: {in_chains}"
        by_id = {r.trajectory_id: r for r in crashed}
        assert all(by_id[t].stop_reason is StopReason.DONE for t in recovered), (
            "the stranded trajectories end done on the surviving worker"
        )
        assert all(by_id[t].stop_reason is StopReason.DONE for t in stranded)
        worst = max(e["since_heartbeat_s"] for e in recoveries)
        print(
            f"{len(recoveries)} turns recovered by the reconciler; worst time from w2's last "
            f"heartbeat to a recovery: {worst:.2f}s (heartbeat timeout 2s)"
        )

        for run, records in ((crash, crashed), (calm, normal)):
            effects = run.effects()
            for r in records:
                if r.stop_reason is StopReason.DONE:
                    assert effects[order_of(r)] == Counter(refund=1, email=1), r.trajectory_id
            twice = sent_twice(run.client, run.prefix)
            assert twice == {}, f"a write was sent twice: {twice}"
            assert [r.trajectory_id for r in records if over_allowance(r)] == []
        redelivered = [ln for ln in crash.fleet.log("w1").splitlines() if "redelivered" in ln]
        assert redelivered == [], "no message came back from the broker: no broker recovery"

        for run in (crash, calm):
            codes = stop_all(run.fleet)
            assert all(code == 0 for code in codes.values()), codes
    finally:
        for run in (crash, calm):
            run.fleet.close()
            delete_member_queues(run.env, run.fleet.procs)
