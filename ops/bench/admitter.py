"""``reins bench admitter``: admission speed, share accuracy, and noisy-neighbour isolation.

In one process with simulated time (nothing sleeps), then through Redis with several admitter
processes. The fields and the method are described in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Iterator
from typing import Protocol

from kernel.errors import SubmissionRefused
from ops.bench.peers import Peer, reins_itself
from router.admission.fairness import jain_index
from router.admission.local import Admitter
from router.admission.tenants import AdmissionConfig

# --- part 1: backlogged tenants -------------------------------------------------------------

#: (tenant, weight, mix of (probability, input tokens, output allowance))
BACKLOGGED = (
    ("support", 3, ((0.7, 2_000, 500), (0.3, 10_000, 2_000))),
    ("repair", 2, ((0.5, 10_000, 2_000), (0.5, 30_000, 4_000))),
    ("maintenance", 1, ((0.5, 40_000, 2_000), (0.5, 60_000, 4_000))),
)
BACKLOG_QUANTUM = 10_000  # seed 004's exercise: 10,000 charge tokens per unit weight per round
BACKLOG_CAP = 100_000  # >= largest call (64,000) + largest quantum (30,000): no clipping
PROVIDER_TOKENS_PER_S = 1_000_000.0  # advances the simulated clock, so the window means something
TRAJECTORIES_PER_TENANT = 64
MANY_TENANTS = 10_000  # the same three profiles, each repeated over a third of them
TRAJECTORIES_PER_MANY = 2  # 20,000 calls queued: every tenant stays backlogged
#: Every backlogged tenant's max_in_flight: configured, and each admitted turn ends (released)
#: before its trajectory is queued again, so the caps' bookkeeping is in the figures; at the
#: trajectories per tenant it never binds, so the shares still measure the weights alone.
IN_FLIGHT_CAP = TRAJECTORIES_PER_TENANT

# --- part 2: noisy neighbour ----------------------------------------------------------------

NOISY_PROVIDER_TOKENS_PER_S = 100_000.0
NOISY_QUANTUM = 5_000  # two interactive calls per visit
INTERACTIVE = ((1.0, 2_000, 500),)
MIXED = ((0.8, 2_000, 500), (0.2, 10_000, 2_000))
QUIET_SHARE_FRACTION = 0.2
LOUD_FACTOR = 100
NOISY_MAX_READY = 1_000


# --- part 3: through Redis (ops.bench.admitter_redis) --------------------------------------

REDIS_ADMITTERS = 4
REDIS_ADMISSIONS = 20_000


def peer() -> Peer:
    """First come, first served: the noisy-neighbour figures' other side (``fifo_*``)."""
    return reins_itself(
        "first come, first served queue",
        "ops.bench.admitter._Fifo in this process: one queue in arrival order, the same "
        "max_ready per tenant, the same simulated arrivals and provider",
    )


def run(quick: bool = False) -> dict[str, object]:
    """Run all parts; ``quick`` is a smaller run for smoke tests (same fields)."""
    from ops.bench import admitter_redis  # part 3 builds on this module's mix

    backlog, many = _backlogged(chunks=2 if quick else 5, chunk=5_000 if quick else 50_000)
    backlog.pop("rounds")
    quiet_calls = 300 if quick else 5_000
    result: dict[str, object] = {
        "peer": peer().as_json(),
        "quick": quick,
        "max_in_flight": IN_FLIGHT_CAP,
        **backlog,
    }
    rate, base = many["admissions_per_s"], backlog["admissions_per_s"]
    assert isinstance(rate, int) and isinstance(base, int)
    result["admissions_per_s_at_10k_tenants"] = rate
    result["admissions_per_s_median_at_10k_tenants"] = many["admissions_per_s_median"]
    result["ratio_10k_to_3_tenants"] = round(rate / base, 3)
    # Over the ~10 DRR rounds such a run spans, while the 3-tenant run spans thousands: the
    # tenants of a profile start together and gather credit in step, so a partial round counts.
    result["max_share_error_pct_pt_at_10k_tenants"] = many["max_share_error_pct_pt"]
    result["drr_rounds_at_10k_tenants"] = many["rounds"]
    result["bytes_per_tenant"] = _bytes_per_tenant(MANY_TENANTS)
    for label, mix in (("", INTERACTIVE), ("_mixed_sizes", MIXED)):
        for kind in ("drr", "fifo"):
            base = _noisy(kind, mix, quiet_calls, loud=False)
            loud = _noisy(kind, mix, quiet_calls, loud=True)
            prefix = "" if kind == "drr" else "fifo_"
            result[f"{prefix}noisy_neighbor_p99_ratio{label}"] = round(loud / base, 3)
            result[f"{prefix}noisy_neighbor_baseline_p99_s{label}"] = round(base, 6)
            result[f"{prefix}noisy_neighbor_loud_p99_s{label}"] = round(loud, 6)
    result["noisy_neighbor_quiet_calls"] = quiet_calls
    result.update(
        admitter_redis.through_redis(
            2 if quick else REDIS_ADMITTERS, 2_000 if quick else REDIS_ADMISSIONS
        )
    )
    return result


def tenant_config(
    tenants: list[tuple[str, float, int]],
    quantum: int,
    cap: int,
    max_ready: int,
    in_flight: int | None = None,
) -> AdmissionConfig:
    return AdmissionConfig.from_mapping(
        {
            "quantum_tokens": quantum,
            "credit_cap_tokens": cap,
            "tenants": [
                {"name": n, "weight": w, "max_ready": max_ready, "largest_call_tokens": largest}
                | ({} if in_flight is None else {"max_in_flight": in_flight})
                for n, w, largest in tenants
            ],
        }
    )


def call_sizes(rng: random.Random, mix: tuple[tuple[float, int, int], ...]) -> tuple[int, int]:
    draw = rng.random()
    for probability, input_tokens, output_allowance in mix:
        draw -= probability
        if draw < 0:
            return input_tokens, output_allowance
    return mix[-1][1], mix[-1][2]


Profile = tuple[str, int, tuple[tuple[float, int, int], ...]]


def _many(count: int) -> tuple[Profile, ...]:
    """``count`` tenants, the i-th with the weight and mix of ``BACKLOGGED[i % 3]``."""
    return tuple(
        (f"{BACKLOGGED[i % 3][0]}-{i}", BACKLOGGED[i % 3][1], BACKLOGGED[i % 3][2])
        for i in range(count)
    )


def _bytes_per_tenant(count: int) -> int:
    """The admitter's memory for ``count`` idle tenants, over ``count`` (Python allocations)."""
    import tracemalloc

    profiles = _many(count)
    config = tenant_config(
        [(n, w, max(i + o for _, i, o in mix)) for n, w, mix in profiles],
        BACKLOG_QUANTUM,
        BACKLOG_CAP,
        max_ready=1,
    )
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        admitter = Admitter(config, lambda: 0.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    del admitter
    return round(held / count)


class _Backlog:
    """Every tenant backlogged with ``per_tenant`` trajectories that come straight back; run
    chunk by chunk, so two of them can alternate and share the machine's noise."""

    def __init__(
        self, tenants: tuple[Profile, ...] = BACKLOGGED, per_tenant: int = TRAJECTORIES_PER_TENANT
    ) -> None:
        rng = random.Random(8)
        config = tenant_config(
            [(n, w, max(i + o for _, i, o in mix)) for n, w, mix in tenants],
            BACKLOG_QUANTUM,
            BACKLOG_CAP,
            max_ready=per_tenant,
            in_flight=per_tenant,
        )
        self.tenants = tenants
        self.clock = [0.0]
        self.admitter = Admitter(config, lambda: self.clock[0])
        # Lane i has the profile BACKLOGGED[i % 3] (the configuration's order), so the loop
        # finds a call's sizes by its lane number: the bench keeps nothing per tenant, and its
        # own work per admission is the same at 3 tenants as at 10,000 (a table per tenant,
        # touched once a round, missed the cache at 10,000 and was counted as the admitter's).
        lanes = [t.tenant for t in self.admitter.figures().tenants]  # in lane order
        assert lanes == [n for n, _, _ in tenants]
        # Sizes are drawn before timing so the loop measures the admitter, not the RNG; one
        # sequence per profile, read at one running count: successive calls of a tenant come
        # from far apart in its sequence, so the copies of a profile do not move in step.
        self.sequences = [[call_sizes(rng, mix) for _ in range(4096)] for _, _, mix in BACKLOGGED]
        self.group = {n: BACKLOGGED[i % len(BACKLOGGED)][0] for i, (n, _, _) in enumerate(tenants)}
        self.drawn = 0
        for lane, (name, _, _) in enumerate(tenants):
            for k in range(per_tenant):
                i, o = self._next_sizes(lane)
                self.admitter.submit(name, f"{name}-{k}", input_tokens=i, output_allowance=o)
        self.counted_from: dict[str, int] = {}  # each tenant's admitted charge, after warm-up
        self.rates: list[float] = []
        self.admissions = 0

    def _next_sizes(self, lane: int) -> tuple[int, int]:
        self.drawn += 1
        return self.sequences[lane % len(BACKLOGGED)][self.drawn & 4095]

    def chunk(self, size: int, counted: bool = True) -> None:
        """Admit ``size`` calls, each ended and requeued at once; time them if ``counted``."""
        nominate, confirm, release, requeue = (
            self.admitter.nominate,
            self.admitter.confirm,
            self.admitter.release,
            self.admitter.requeue,
        )
        clock, sequences, profiles = self.clock, self.sequences, len(BACKLOGGED)
        drawn = self.drawn
        started = time.perf_counter()
        for _ in range(size):
            nomination = nominate()
            assert nomination is not None  # backlogged by construction
            confirm(nomination)
            call = nomination.call
            tenant = call.tenant
            clock[0] += call.charge / PROVIDER_TOKENS_PER_S
            drawn += 1
            i, o = sequences[nomination.lane % profiles][drawn & 4095]
            release(tenant, call.trajectory_id)  # the turn ended
            requeue(tenant, call.trajectory_id, input_tokens=i, output_allowance=o)
        elapsed = time.perf_counter() - started
        self.drawn = drawn
        if counted:
            self.rates.append(size / elapsed)
            self.admissions += size
        elif not self.rates:  # the warm-up: the shares count from here (the admitter's tally)
            self.counted_from = {
                t.tenant: t.admitted_charge for t in self.admitter.figures().tenants
            }

    def summary(self) -> dict[str, object]:
        """Speed (best and median chunk), shares by profile against weight, Jain's index."""
        tenants = self.tenants
        charge = {
            t.tenant: t.admitted_charge - self.counted_from.get(t.tenant, 0)
            for t in self.admitter.figures().tenants
        }
        by_group, weight_of = _by_group(tenants, self.group, charge)
        total, weight_total = sum(by_group.values()), sum(weight_of.values())
        errors = [abs(by_group[g] / total - weight_of[g] / weight_total) * 100 for g in by_group]
        figures = self.admitter.figures()
        return {
            "admissions": self.admissions,
            "admissions_per_s": round(max(self.rates)),
            "admissions_per_s_median": round(statistics.median(self.rates)),
            "charge_share_pct": {g: round(100 * by_group[g] / total, 3) for g in by_group},
            "weight_share_pct": {g: round(100 * weight_of[g] / weight_total, 3) for g in by_group},
            "max_share_error_pct_pt": round(max(errors), 4),
            "rounds": self.admitter.state.rounds,
            "jain_index": round(figures.jain_index or 0.0, 6),
            "jain_index_window_s": figures.window_s,
            "jain_index_whole_run": round(
                jain_index([charge[n] / w for n, w, _ in tenants]) or 0.0, 6
            ),
        }


def _backlogged(chunks: int, chunk: int) -> tuple[dict[str, object], dict[str, object]]:
    """The three tenants of BACKLOGGED, and MANY_TENANTS of the same profiles, alternating
    chunk by chunk (the first chunk of each warms up and is neither timed nor counted)."""
    few, many = _Backlog(), _Backlog(_many(MANY_TENANTS), TRAJECTORIES_PER_MANY)
    for c in range(chunks + 1):
        for run in (few, many) if c % 2 else (many, few):
            run.chunk(chunk, counted=c > 0)
    return few.summary(), many.summary()


def _by_group(
    tenants: tuple[Profile, ...], group: dict[str, str], charge: dict[str, int]
) -> tuple[dict[str, int], dict[str, float]]:
    """Charge and weight summed by profile."""
    by_group: dict[str, int] = {}
    weight_of: dict[str, float] = {}
    for name, weight, _ in tenants:
        g = group[name]
        by_group[g] = by_group.get(g, 0) + charge[name]
        weight_of[g] = weight_of.get(g, 0.0) + weight
    return by_group, weight_of


# --- part 2 ---------------------------------------------------------------------------------


class _Discipline(Protocol):
    def offer(self, tenant: str, key: str, size: tuple[int, int], now: float) -> None: ...
    def backlogged(self) -> bool: ...
    def admit(self) -> tuple[str, int, float]: ...


class _Weighted:
    """The admitter under test, seen through the simulation's three verbs."""

    def __init__(self, clock: list[float], mix: tuple[tuple[float, int, int], ...]) -> None:
        largest = max(i + o for _, i, o in mix)
        config = tenant_config(
            [("quiet", 1, largest), ("neighbour", 1, largest)],
            NOISY_QUANTUM,
            largest + NOISY_QUANTUM,
            max_ready=NOISY_MAX_READY,
        )
        self.admitter = Admitter(config, lambda: clock[0])

    def offer(self, tenant: str, key: str, size: tuple[int, int], now: float) -> None:
        # Over max_ready the loud neighbour is refused at the door, as the router would refuse it.
        with contextlib.suppress(SubmissionRefused):
            self.admitter.submit(tenant, key, input_tokens=size[0], output_allowance=size[1])

    def backlogged(self) -> bool:
        return any(self.admitter.state.queued)

    def admit(self) -> tuple[str, int, float]:
        nomination = self.admitter.nominate()
        assert nomination is not None
        wait = self.admitter.confirm(nomination)
        return nomination.call.tenant, nomination.call.charge, wait


class _Fifo:
    """The peer: one queue in arrival order, the same max_ready per tenant."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.queue: deque[tuple[str, int, float]] = deque()
        self.depth: dict[str, int] = {}

    def offer(self, tenant: str, key: str, size: tuple[int, int], now: float) -> None:
        if self.depth.get(tenant, 0) < NOISY_MAX_READY:
            self.queue.append((tenant, size[0] + size[1], now))
            self.depth[tenant] = self.depth.get(tenant, 0) + 1

    def backlogged(self) -> bool:
        return bool(self.queue)

    def admit(self) -> tuple[str, int, float]:
        tenant, charge, ready_at = self.queue.popleft()
        self.depth[tenant] -= 1
        return tenant, charge, self.clock[0] - ready_at


def _poisson(
    seed: int, rate: float, horizon: float, mix: tuple[tuple[float, int, int], ...]
) -> Iterator[tuple[float, tuple[int, int]]]:
    rng = random.Random(seed)
    t = rng.expovariate(rate)
    while t <= horizon:
        yield t, call_sizes(rng, mix)
        t += rng.expovariate(rate)


def _noisy(
    kind: str, mix: tuple[tuple[float, int, int], ...], quiet_calls: int, *, loud: bool
) -> float:
    """The quiet tenant's p99 admission wait (simulated seconds) under one discipline."""
    mean_charge = sum(p * (i + o) for p, i, o in mix)
    share = NOISY_PROVIDER_TOKENS_PER_S / 2  # equal weights
    rate = QUIET_SHARE_FRACTION * share / mean_charge
    horizon = quiet_calls / rate
    clock = [0.0]
    discipline: _Discipline = _Weighted(clock, mix) if kind == "drr" else _Fifo(clock)
    # Same seeds for every discipline and both loads: only the neighbour's rate differs.
    streams = {
        "quiet": _poisson(11, rate, horizon, mix),
        "neighbour": _poisson(12, rate * (LOUD_FACTOR if loud else 1), horizon, mix),
    }
    upcoming = {name: next(stream, None) for name, stream in streams.items()}
    waits: list[float] = []
    free_at = 0.0
    serial = 0
    while True:
        name = min(upcoming, key=lambda n: _at(upcoming[n]))
        arrival = upcoming[name]
        next_arrival = _at(arrival)
        if discipline.backlogged() and max(free_at, clock[0]) <= next_arrival:
            clock[0] = max(free_at, clock[0])
            tenant, charge, wait = discipline.admit()
            if tenant == "quiet":
                waits.append(wait)
            free_at = clock[0] + charge / NOISY_PROVIDER_TOKENS_PER_S
            continue
        if arrival is None:
            break
        clock[0] = arrival[0]
        serial += 1
        discipline.offer(name, f"{name}-{serial}", arrival[1], arrival[0])
        upcoming[name] = next(streams[name], None)
    waits.sort()
    return waits[max(0, math.ceil(0.99 * len(waits)) - 1)]


def _at(arrival: tuple[float, tuple[int, int]] | None) -> float:
    return math.inf if arrival is None else arrival[0]
