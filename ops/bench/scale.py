"""``reins bench scale``: one router replica's scheduling core at fleet scale, simulated.

The router's own ring (:class:`~router.placement.ring.Ring`, changed as a router changes it),
admitter (:class:`~router.admission.local.Admitter`, 10,000 weighted tenants) and placement
(:func:`~router.process.dispatch.placement_key` and the ring lookup the dispatcher makes) run
against 1,000 simulated workers and a simulated model: a discrete-event clock (a heap of events), no
Celery, no sleeping. Each admission is placed on its worker; a worker runs a few turns at once and
queues the rest; a finished turn brings its trajectory back READY until its last turn. Every few
simulated minutes a worker leaves and another joins (the ring changes as ``ReplicaRing.refresh``
changes it). The router's CPU is timed section by section; then the shared admitter's scripts are
timed against the real Redis to say how many replicas its one slot carries. The method is described
in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import random
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError

from kernel.errors import ReinsError, SubmissionRefused
from kernel.settings import Settings
from ops.bench.peers import Peer, none
from router.admission.claims import ReturningCall
from router.admission.local import Admitter
from router.admission.redis.admitter import RedisAdmitter
from router.admission.tenants import AdmissionConfig
from router.placement.ring import Member, Ring
from router.process.dispatch import placement_key
from router.process.heap import return_large_blocks
from store.redis_client import client_from_url

WORKERS = 1_000
TENANTS = 10_000
TRAJECTORIES = 1_000_000
QUICK_TRAJECTORIES = 20_000
SLOTS = 8  # turns a simulated worker runs at once (the rest wait in its queue)
LOAD = 0.9  # arrivals as a fraction of what the fleet can run
TURNS_MEAN = 4.0  # turns per trajectory: 1 + geometric
LATENCY_MEDIAN_S = 2.0  # one turn's model call, lognormal
LATENCY_SIGMA = 0.6
CHURN_EVERY_S = 120.0  # a worker leaves and another joins, in simulated seconds
QUANTUM = 10_000
CAP = 100_000
#: (weight, input tokens, output allowance) of the three tenant profiles, in turn
PROFILES = ((3, 2_000, 500), (2, 10_000, 2_000), (1, 40_000, 4_000))
REDIS_ADMISSIONS = 1_600  # admissions timed in windows no other client's script ran in
REDIS_BATCH = 16  # the dispatcher's claim batch
REDIS_TENANTS_QUEUED = 2_000  # tenants with a call queued during the Redis measurement

_ARRIVE, _DONE, _CHURN = 0, 1, 2


def peer() -> Peer:
    """None: one replica's own rates against the Redis slot's, no other system beside it."""
    return none(
        "a capacity model: the router's CPU per admission against the shared admitter's Redis "
        "time per admission (INFO commandstats evalsha), on simulated workers"
    )


def run(quick: bool = False, trajectories: int | None = None) -> dict[str, object]:
    """Simulate ``trajectories`` (default 1,000,000; ``quick``: 20,000) through one replica."""
    default = QUICK_TRAJECTORIES if quick else TRAJECTORIES
    count = default if trajectories is None else trajectories
    if count < 1:
        raise ValueError(f"trajectories must be at least 1, got {count}")
    return_large_blocks()  # as the router does (router/process/heap.py)
    result: dict[str, object] = {
        "peer": peer().as_json(),
        "quick": quick,
        **_Simulation(count).run(),
    }
    result.update(_redis_cost())
    # How many replicas the one slot carries: each replica admitting at its full CPU rate, and
    # each at the rate one replica reached through Redis here (round trips, not CPU, bound it).
    per_cpu = result["router_admissions_per_cpu_s"]
    for suffix in ("", "_with_depths"):
        slot, wall = (result.get(f"redis_{k}_admissions_per_s{suffix}") for k in ("slot", "wall"))
        if isinstance(slot, int) and isinstance(per_cpu, int) and isinstance(wall, int):
            result[f"replicas_per_redis_slot_at_cpu_rate{suffix}"] = round(slot / per_cpu, 2)
            result[f"replicas_per_redis_slot_at_redis_rate{suffix}"] = round(slot / wall, 2)
    return result


def _config() -> AdmissionConfig:
    return AdmissionConfig.from_mapping(
        {
            "quantum_tokens": QUANTUM,
            "credit_cap_tokens": CAP,
            "tenants": [
                {
                    "name": f"tenant-{i:05d}",
                    "weight": PROFILES[i % 3][0],
                    "max_ready": 1_000,
                    "largest_call_tokens": PROFILES[i % 3][1] + PROFILES[i % 3][2],
                }
                for i in range(TENANTS)
            ],
        }
    )


class _Timer:
    """CPU seconds spent in one part of the router, by section, less the timer's own cost."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.calls = 0
        clock = time.process_time
        started = clock()
        for _ in range(10_000):
            clock()
        self.overhead = (clock() - started) / 10_000  # one reading

    def seconds(self) -> float:
        return max(0.0, self.spent - 2 * self.overhead * self.calls)


class _Simulation:
    """The fleet, the arrivals and the model, around the router's real parts."""

    def __init__(self, trajectories: int) -> None:
        self.rng = random.Random(29)
        self.target = trajectories
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self.serial = 0
        capacity = WORKERS * SLOTS
        turns_per_s = capacity / LATENCY_MEDIAN_S / math.exp(LATENCY_SIGMA**2 / 2)
        self.arrival_rate = LOAD * turns_per_s / TURNS_MEAN
        self.admit_time, self.place_time = _Timer(), _Timer()
        started = time.process_time()
        self.ring = Ring(Member(f"worker-{i:04d}") for i in range(WORKERS))
        self.ring_build_s = time.process_time() - started
        self.ring_changes: list[float] = []
        self.workers = {m.name: _Worker() for m in self.ring.members}
        self.joined = WORKERS
        self.admitter = Admitter(_config(), lambda: self.now)
        # A few tenants submit most trajectories: weights 1/rank (Zipf), drawn by bisection.
        self.tenant_weights = [1 / (rank + 1) for rank in range(TENANTS)]
        self.turns_left: dict[str, int] = {}
        self.arrived = self.refused = self.finished = 0
        self.admissions = self.turns_done = 0
        self.waits: list[float] = []

    def run(self) -> dict[str, object]:
        wall = time.perf_counter()
        cpu = time.process_time()
        self._at(0.0, _ARRIVE, None)
        self._at(CHURN_EVERY_S, _CHURN, None)
        while self.events and self.finished + self.refused < self.target:
            self.now, _, kind, data = heapq.heappop(self.events)
            if kind == _ARRIVE:
                self._arrive()
            elif kind == _DONE:
                self._done(*data)
            else:
                self._churn()
            self._admit()
        cpu = time.process_time() - cpu
        admit_s, place_s = self.admit_time.seconds(), self.place_time.seconds()
        router_s = admit_s + place_s + sum(self.ring_changes)
        loads = [w.turns for w in self.workers.values() if w.turns]
        waits = sorted(self.waits) or [0.0]
        return {
            "workers": WORKERS,
            "tenants": TENANTS,
            "trajectories": self.finished + self.refused,
            "trajectories_refused": self.refused,
            "admissions": self.admissions,
            "simulated_s": round(self.now, 1),
            "run_cpu_s": round(cpu, 1),
            "run_wall_s": round(time.perf_counter() - wall, 1),
            "router_cpu_s": round(router_s, 2),
            "admitter_cpu_s": round(admit_s, 2),
            "placement_cpu_s": round(place_s, 2),
            "ring_build_s": round(self.ring_build_s, 2),
            "ring_changes": len(self.ring_changes),
            "ring_change_ms_median": round(1000 * statistics.median(self.ring_changes or [0]), 2),
            "ring_change_ms_max": round(1000 * max(self.ring_changes or [0]), 2),
            "router_admissions_per_cpu_s": round(self.admissions / router_s),
            "admissions_per_admitter_cpu_s": round(self.admissions / admit_s),
            "placements_per_cpu_s": round(self.admissions / place_s),
            "admissions_per_simulated_s": round(self.admissions / self.now),
            "worker_turns_max_over_mean": round(max(loads) / statistics.mean(loads), 3),
            "worker_queue_wait_p99_s": round(waits[max(0, math.ceil(0.99 * len(waits)) - 1)], 3),
        }

    # --- events ------------------------------------------------------------------------------

    def _at(self, when: float, kind: int, data: Any) -> None:
        self.serial += 1
        heapq.heappush(self.events, (when, self.serial, kind, data))

    def _arrive(self) -> None:
        if self.arrived < self.target:
            self._at(self.now + self.rng.expovariate(self.arrival_rate), _ARRIVE, None)
        self.arrived += 1
        lane = self.rng.choices(range(TENANTS), cum_weights=self._cumulative())[0]
        tenant, tid = f"tenant-{lane:05d}", f"t{self.arrived}"
        turns = 1 + int(self.rng.expovariate(1 / (TURNS_MEAN - 1)))
        _, tokens, allowance = PROFILES[lane % 3]
        try:
            with _timed(self.admit_time):
                self.admitter.submit(tenant, tid, input_tokens=tokens, output_allowance=allowance)
        except SubmissionRefused:
            self.refused += 1
            return
        self.turns_left[tid] = turns

    def _cumulative(self) -> list[float]:
        cumulative = getattr(self, "_cum", None)
        if cumulative is None:
            total, cumulative = 0.0, []
            for w in self.tenant_weights:
                total += w
                cumulative.append(total)
            self._cum = cumulative
        return cumulative

    def _done(self, member: str, tenant: str, tid: str) -> None:
        worker = self.workers[member]
        worker.running -= 1
        self.turns_done += 1
        if worker.queue:  # the worker's queue: the next turn starts now
            queued_at, t, q = worker.queue.popleft()
            self.waits.append(self.now - queued_at)
            self._start(member, t, q)
        left = self.turns_left[tid] = self.turns_left[tid] - 1
        if left <= 0:
            del self.turns_left[tid]
            self.finished += 1
            return
        lane = int(tenant.rsplit("-", 1)[1])
        _, tokens, allowance = PROFILES[lane % 3]
        with _timed(self.admit_time):
            self.admitter.requeue(tenant, tid, input_tokens=tokens, output_allowance=allowance)

    def _churn(self) -> None:
        """The oldest worker leaves, a new one joins: one ring change, as a replica applies it."""
        self._at(self.now + CHURN_EVERY_S, _CHURN, None)
        leaving = self.ring.members[0].name
        self.joined += 1
        joining = f"worker-{self.joined:04d}"
        members = [m for m in self.ring.members if m.name != leaving] + [Member(joining)]
        started = time.process_time()
        self.ring = self.ring.evolved(members)
        self.ring_changes.append(time.process_time() - started)
        self.workers[joining] = _Worker()  # the leaver finishes what it holds (a drain)

    def _admit(self) -> None:
        """As the dispatcher's loop: admit while the fleet has a free slot, place each call."""
        free = WORKERS * SLOTS - self.running()
        admitter, ring = self.admitter, self.ring
        while free > 0:
            with _timed(self.admit_time):
                nomination = admitter.nominate()
                if nomination is None:
                    return
                admitter.confirm(nomination)
            call = nomination.call
            with _timed(self.place_time):
                member = ring.lookup(placement_key(call.tenant, call.trajectory_id))
            self.admissions += 1
            free -= 1
            worker = self.workers[member]
            if worker.running < SLOTS:
                self._start(member, call.tenant, call.trajectory_id)
            else:
                worker.queue.append((self.now, call.tenant, call.trajectory_id))

    def running(self) -> int:
        return self.admissions - self.turns_done

    def _start(self, member: str, tenant: str, tid: str) -> None:
        worker = self.workers[member]
        worker.running += 1
        worker.turns += 1
        latency = LATENCY_MEDIAN_S * math.exp(self.rng.gauss(0.0, LATENCY_SIGMA))
        self._at(self.now + latency, _DONE, (member, tenant, tid))


class _Worker:
    """A simulated worker: turns running, turns waiting in its queue, turns run in all."""

    __slots__ = ("queue", "running", "turns")

    def __init__(self) -> None:
        self.running = 0
        self.turns = 0
        self.queue: deque[tuple[float, str, str]] = deque()


class _timed:
    """Add the CPU time of a block to a timer."""

    __slots__ = ("started", "timer")

    def __init__(self, timer: _Timer) -> None:
        self.timer = timer

    def __enter__(self) -> None:
        self.started = time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.timer.spent += time.process_time() - self.started
        self.timer.calls += 1


# --- the shared admitter's Redis slot ---------------------------------------------------------


def _redis_cost() -> dict[str, object]:
    """The Redis CPU one admission costs in the shared admitter's scripts, at 10,000 tenants:
    claim (a batch as the dispatcher claims), confirm, requeue, from the server's own counters."""
    url = Settings.from_env(os.environ).redis_url
    out: dict[str, object] = {}
    # With depths (as the dispatcher claims today) a claim reads every tenant's depth: so slow
    # that a tenth of the windows tell it, and others' scripts (~0.1 ms each) hardly count.
    for depths, suffix, target in ((False, "", REDIS_ADMISSIONS), (True, "_with_depths", 160)):
        try:
            out.update(_redis_run(url, depths, suffix, target))
        except (ReinsError, OSError, RedisError) as exc:
            out[f"redis_error{suffix}"] = str(exc)
    return out


def _redis_run(url: str, depths: bool, suffix: str, target: int) -> dict[str, object]:
    prefix = f"reins-bench-scale-{uuid.uuid4().hex[:12]}"
    client = client_from_url(url)
    try:
        admitter = RedisAdmitter(client, _config(), prefix=prefix)
        for lane in range(REDIS_TENANTS_QUEUED):
            _, tokens, allowance = PROFILES[lane % 3]
            admitter.submit(
                f"tenant-{lane:05d}", f"r{lane}", input_tokens=tokens, output_allowance=allowance
            )
        wall = time.perf_counter()
        admitted = clean = usec = foreign = 0
        # Until enough windows ran alone, or too many did not (another client's busy spell).
        while clean < target and admitted < 10 * target:
            before = _evalsha(client)
            claims = admitter.claim_many(REDIS_BATCH, 1, depths=depths).claims
            admitter.confirm_many(claims)
            admitter.requeue_many(
                ReturningCall(c.call.tenant, c.call.trajectory_id, c.call.input_tokens,
                              c.call.output_allowance, None, None)
                for c in claims
            )  # fmt: skip
            after = _evalsha(client)
            admitted += len(claims)
            # The server is shared: a window where another client ran a script is left out.
            if after[0] - before[0] == 3 or depths:
                clean += len(claims)
                usec += after[1] - before[1]
            if after[0] - before[0] != 3:
                foreign += 1
        wall = time.perf_counter() - wall
        if not clean:
            raise RedisError("every measured window held another client's scripts")
        per_admission = usec / clean
        return {
            f"redis_us_per_admission{suffix}": round(per_admission, 2),
            f"redis_slot_admissions_per_s{suffix}": round(1_000_000 / per_admission),
            f"redis_wall_admissions_per_s{suffix}": round(admitted / wall),
            f"redis_admissions_timed{suffix}": clean,
            f"redis_windows_with_other_scripts{suffix}": foreign,
            f"redis_other_scripts_counted{suffix}": depths,
        }
    finally:
        with contextlib.suppress(RedisError):
            keys = list(client.scan_iter(match=f"{{{prefix}:*", count=1000))
            for i in range(0, len(keys), 1000):
                client.delete(*keys[i : i + 1000])


def _evalsha(client: Any) -> tuple[int, int]:
    """The server's EVALSHA count and microseconds so far."""
    stats: Callable[..., Any] = client.info
    found = stats("commandstats").get("cmdstat_evalsha", {})
    return int(found.get("calls", 0)), int(found.get("usec", 0))
