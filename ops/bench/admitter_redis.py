"""``reins bench admitter``, part 3: the shared admitter through Redis, several admitter
processes claiming, confirming and requeueing side by side (``docs/benchmarks.md``)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import time
import uuid
from typing import Any

from redis.exceptions import RedisError

from kernel.errors import ReinsError
from kernel.settings import Settings
from ops.bench.admitter import (
    BACKLOG_CAP,
    BACKLOG_QUANTUM,
    BACKLOGGED,
    IN_FLIGHT_CAP,
    TRAJECTORIES_PER_TENANT,
    call_sizes,
    tenant_config,
)
from router.admission.claims import EndedTurn, ReturningCall
from router.admission.gates import GateConfig
from router.admission.redis.admitter import Claim, RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig
from store.redis_client import client_from_url

REDIS_ROUTE = "bench/model"
REDIS_BATCH = 16  # calls per claim script run: a dispatcher filling that many free slots


def _redis_setup(client: Any, prefix: str) -> tuple[RedisAdmitter, AdmissionConfig]:
    config = tenant_config(
        [(n, w, max(i + o for _, i, o in mix)) for n, w, mix in BACKLOGGED],
        BACKLOG_QUANTUM,
        BACKLOG_CAP,
        max_ready=TRAJECTORIES_PER_TENANT,
        in_flight=IN_FLIGHT_CAP,
    )
    gates = RedisGates(
        client, GateConfig.from_mapping({"routes": {REDIS_ROUTE: {}}}), prefix=prefix
    )
    return RedisAdmitter(client, config, prefix=prefix, gates=gates), config


def _redis_worker(
    url: str, prefix: str, quota: int, batch: int, ready: Any, start: Any, done: Any
) -> None:
    """One admitter process: claim, confirm, requeue, ``quota`` times after the common start;
    ``batch`` calls per round trip (1: one call per script run, the plain interface)."""
    admitter, _ = _redis_setup(client_from_url(url), prefix)
    ready.release()
    start.wait()
    admitted = 0
    while admitted < quota:
        claims: tuple[Claim, ...]
        if batch == 1:
            claim = admitter.nominate()
            claims = () if claim is None else (claim,)
            if claim is not None:
                admitter.confirm(claim)
        else:
            claims = admitter.claim_many(min(batch, quota - admitted)).claims
            admitter.confirm_many(claims)
        if not claims:  # every call is claimed by the others this instant
            continue
        admitter.release_many(
            EndedTurn(c.call.tenant, c.call.trajectory_id, c.claim_id) for c in claims
        )
        admitter.requeue_many(
            ReturningCall(
                c.call.tenant,
                c.call.trajectory_id,
                c.call.input_tokens,
                c.call.output_allowance,
                None,
                c.call.route,
            )
            for c in claims
        )
        admitted += len(claims)
    done.put((admitted, time.perf_counter()))


def through_redis(processes: int, admissions: int) -> dict[str, object]:
    url = Settings.from_env(os.environ).redis_url
    result: dict[str, object] = {"redis_admitters": processes}
    for batch, suffix in ((REDIS_BATCH, ""), (1, "_unbatched")):
        try:
            admitted, rate, shares = _redis_run(url, processes, admissions, batch)
        except (ReinsError, OSError, RuntimeError, RedisError) as exc:
            result[f"redis_admissions{suffix}"] = 0
            result[f"redis_admissions_per_s{suffix}"] = None
            result["redis_error"] = str(exc)
            continue
        result[f"redis_admissions{suffix}"] = admitted
        result[f"redis_admissions_per_s{suffix}"] = rate
        if suffix == "":
            result["redis_claim_batch"] = batch
            result["redis_charge_share_pct"] = shares
    return result


def _redis_run(
    url: str, processes: int, admissions: int, batch: int
) -> tuple[int, int, dict[str, float]]:
    prefix = f"reins-bench-admitter-{uuid.uuid4().hex[:12]}"
    client = client_from_url(url)
    try:
        admitter, _ = _redis_setup(client, prefix)
        assert admitter.gates is not None
        admitter.gates.configure()
        rng = random.Random(9)
        for name, _, mix in BACKLOGGED:
            for k in range(TRAJECTORIES_PER_TENANT):
                i, o = call_sizes(rng, mix)
                admitter.submit(
                    name, f"{name}-{k}", input_tokens=i, output_allowance=o, route=REDIS_ROUTE
                )
        ctx = multiprocessing.get_context("spawn")
        ready, start, done = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        quota = admissions // processes
        workers = [
            ctx.Process(target=_redis_worker, args=(url, prefix, quota, batch, ready, start, done))
            for _ in range(processes)
        ]
        for w in workers:
            w.start()
        try:
            for _ in workers:
                if not ready.acquire(timeout=60):
                    raise RuntimeError("an admitter process did not start")
            began = time.perf_counter()
            start.set()
            results = [done.get(timeout=600) for _ in workers]
        finally:
            for w in workers:
                w.join(timeout=10)
                if w.is_alive():
                    w.kill()  # one this run started, by its handle
        admitted = sum(n for n, _ in results)
        elapsed = max(t for _, t in results) - began
        charge = [c for _, c in admitter.admitted()]
        shares = {
            n: round(100 * c / sum(charge), 3)
            for (n, _, _), c in zip(BACKLOGGED, charge, strict=True)
        }
        return admitted, round(admitted / elapsed), shares
    finally:
        with contextlib.suppress(RedisError):
            keys = list(client.scan_iter(match=f"{{{prefix}:*", count=1000))
            if keys:
                client.delete(*keys)
