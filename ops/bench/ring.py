"""``reins bench ring``: the placement ring side by side with uhashring, in one run.

The same keys and members, each side at its defaults and hashing its own keys in the timed loop;
then the ring alone at fleet scale (200 and 1,000 members, each in a fresh process): what one
membership change costs and what the ring holds in memory. The method is described in
``docs/benchmarks.md``.
"""

from __future__ import annotations

import gc
import multiprocessing
import platform
import random
import resource
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence

from xxhash import xxh64_intdigest

from kernel.errors import InvalidInput
from ops.bench.peers import Peer, installed
from router.placement.ring import DEFAULT_POINTS_PER_WEIGHT, Member, Ring
from router.process.heap import return_large_blocks

MEMBERS = 20
KEYS = 200_000
QUICK_KEYS = 10_000
UHASHRING_DEFAULT_POINTS = 160
_SEED = 20_010_601
_SLICE = 10_000  # keys per timed slice
SCALES = (200, 1_000)
CHANGES = 3  # joins and as many leaves timed at each scale


def peer() -> Peer:
    """uhashring at its defaults, hashing its own keys in the same timed loop."""
    return Peer(
        name="uhashring HashRing",
        version=installed("uhashring"),
        path=f"HashRing(nodes=...) at its defaults ({UHASHRING_DEFAULT_POINTS} points a node, "
        "md5), get_node per key, in this process",
    )


def run(quick: bool = False) -> dict[str, object]:
    """Measure lookup speed, balance and movement on add; return one flat JSON-able object."""
    try:
        from uhashring import HashRing
    except ModuleNotFoundError:
        raise InvalidInput("bench ring needs uhashring: pip install -e '.[bench]'") from None
    key_count = QUICK_KEYS if quick else KEYS
    repeats = 2 if quick else 7
    keys = _keys(key_count)
    names = [f"worker-{i:02d}" for i in range(MEMBERS)]

    started = time.perf_counter()
    ring = Ring(Member(name) for name in names)
    build_s = time.perf_counter() - started
    plain = Ring((Member(name) for name in names), index_bits=0)
    hashring = HashRing(nodes=names)

    best = _best_times(
        {"reins": ring.lookup, "bisect": plain.lookup, "uhashring": hashring.get_node},
        keys,
        repeats,
    )
    lookups_per_s = key_count / best["reins"]
    peer_lookups_per_s = key_count / best["uhashring"]

    placed = [ring.lookup(key) for key in keys]
    peer_placed = [hashring.get_node(key) for key in keys]
    grown = Ring(Member(name) for name in [*names, "worker-new"])
    moved = [(old, grown.lookup(key)) for key, old in zip(keys, placed, strict=True)]
    moved = [(old, new) for old, new in moved if old != new]
    positions = [xxh64_intdigest(key.encode()) for key in keys]
    modulo_moved = sum(1 for p in positions if p % MEMBERS != p % (MEMBERS + 1))

    return {
        "peer": peer().as_json(),
        "keys": key_count,
        "members": MEMBERS,
        "repeats": repeats,
        "points_per_member": DEFAULT_POINTS_PER_WEIGHT,
        "uhashring_points_per_member": UHASHRING_DEFAULT_POINTS,
        "lookups_per_s": round(lookups_per_s),
        "uhashring_lookups_per_s": round(peer_lookups_per_s),
        "ratio": round(lookups_per_s / peer_lookups_per_s, 3),
        "bisect_lookups_per_s": round(key_count / best["bisect"]),
        "index_speedup_over_bisect": round(best["bisect"] / best["reins"], 3),
        "ring_build_s": round(build_s, 4),
        "index_buckets": ring.index_shape[0],
        "owner_arcs": ring.index_shape[1],
        "max_over_mean_load": round(_max_over_mean(placed, MEMBERS), 4),
        "uhashring_max_over_mean_load": round(_max_over_mean(peer_placed, MEMBERS), 4),
        "moved_fraction_on_add": round(len(moved) / key_count, 5),
        "ideal_moved_fraction": round(1 / (MEMBERS + 1), 5),
        "moved_to_new_member": (
            round(sum(new == "worker-new" for _, new in moved) / len(moved), 5) if moved else 0.0
        ),
        "modulo_moved_fraction": round(modulo_moved / key_count, 5),
        **_at_scales(SCALES[:1] if quick else SCALES, keys[:QUICK_KEYS]),
        "python_version": platform.python_version(),
        "reins_version": installed("reins"),
        "uhashring_version": installed("uhashring"),
        "xxhash_version": installed("xxhash"),
    }


def _at_scales(scales: Sequence[int], keys: list[str]) -> dict[str, object]:
    """Each scale measured in a fresh process, so its memory is the ring's and not this run's."""
    ctx = multiprocessing.get_context("spawn")
    out: dict[str, object] = {}
    with ctx.Pool(1, maxtasksperchild=1) as pool:
        for members in scales:
            for field, value in pool.apply(_at_scale, (members, keys)).items():
                out[f"{field}_at_{members}"] = value
    return out


def _at_scale(members: int, keys: list[str]) -> dict[str, object]:
    """Build a ring of ``members`` from scratch, then time joins and leaves as a router applies
    them (:meth:`Ring.evolved`, the ring before each change kept until the new one is swapped
    in); milliseconds of this process's CPU, the median of the joins and leaves."""
    return_large_blocks()  # as the router does (router/process/heap.py)
    names = [f"worker-{i:04d}" for i in range(members)]
    started = time.process_time()
    ring = Ring(Member(name) for name in names)
    build_s = time.process_time() - started
    costs: list[float] = []
    for i in range(CHANGES):
        started = time.process_time()
        grown = ring.evolved([*ring.members, Member(f"joining-{i}")])
        costs.append(time.process_time() - started)
        started = time.process_time()
        ring = grown.evolved(m for m in grown.members if m.name != names[i])
        costs.append(time.process_time() - started)
        del grown
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        lookup_s = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for key in keys:
                ring.lookup(key)
            lookup_s = min(lookup_s, time.perf_counter() - started)
    finally:
        if enabled:
            gc.enable()
    shares = ring.shares().values()
    return {
        "rebuild_ms": round(1000 * statistics.median(costs), 2),
        "rebuild_ms_max": round(1000 * max(costs), 2),
        "build_s": round(build_s, 2),
        "rss_mb": round(_rss_mb(), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "points": ring.point_count,
        "owner_arcs": ring.index_shape[1],
        "lookups_per_s": round(len(keys) / lookup_s),
        "max_over_mean_share": round(max(shares) * len(shares), 4),
    }


def _rss_mb() -> float:
    """This process's resident memory now (Linux), in MiB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def _keys(count: int) -> list[str]:
    """Deterministic trajectory-like ids, the same on every run."""
    rng = random.Random(_SEED)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def _best_times(
    lookups: dict[str, Callable[[str], object]], keys: Sequence[str], repeats: int
) -> dict[str, float]:
    """Each lookup's time over all ``keys``: per slice of keys, the best of ``repeats`` runs.

    The contenders alternate slice by slice (and swap order every repeat), so a burst of load
    from a neighbour on this shared machine lands on both sides rather than skewing the ratio.
    """
    slices = [keys[i : i + _SLICE] for i in range(0, len(keys), _SLICE)]
    best = {name: [float("inf")] * len(slices) for name in lookups}
    order = list(lookups.items())
    # A collection pause landing in one side's loop would skew the ratio; both run without.
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for index, chunk in enumerate(slices):
                for name, lookup in order:
                    started = time.perf_counter()
                    for key in chunk:
                        lookup(key)
                    elapsed = time.perf_counter() - started
                    best[name][index] = min(best[name][index], elapsed)
            order.reverse()
    finally:
        if enabled:
            gc.enable()
    return {name: sum(times) for name, times in best.items()}


def _max_over_mean(placed: Sequence[object], members: int) -> float:
    counts = Counter(placed)
    return max(counts.values()) / (len(placed) / members)
