"""Two admitter processes on one Redis admit 10,000 calls through one narrow provider gate.

What must hold: no call is admitted twice; at every admission the gate's counters,
returned by the very script that debited them, are within their limits; the gates refuse at
least 20 % of nominations; the loopback provider, counting by its own clock over arrivals,
never sees a limit passed; while every tenant has READY work (equal backlogs) each tenant's
share of the admitted charge is within 1 percentage point of its weight share, and the same
run with FIFO admission is not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from tests.quota.fleet import (
    CONCURRENCY,
    CONFIG,
    GATES,
    ROUTE,
    RPM,
    TPM,
    WEIGHTS,
    WINDOW_S,
    LoopbackProvider,
    backlog,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 2


def run(client: redis.Redis, prefix: str, mode: str, tmp: Path) -> dict[str, Any]:
    """Queue the backlog, run two admitter processes against the provider, merge their logs."""
    gates = RedisGates(client, GATES, prefix=prefix)
    gates.configure()
    calls = backlog()
    if mode == "drr":
        admitter = RedisAdmitter(client, CONFIG, prefix=prefix, gates=gates)
        for tenant, tid, i, o in calls:
            admitter.submit(tenant, tid, input_tokens=i, output_allowance=o, route=ROUTE)
    else:
        tag = f"{{{prefix}:fifo}}"
        pipe = client.pipeline(transaction=False)
        for tenant, tid, i, o in calls:
            pipe.hset(f"{tag}:calls:{tid}", mapping={"tenant": tenant, "input": i, "output": o})
            pipe.rpush(f"{tag}:queue", tid)
        pipe.hset(f"{tag}:depth", mapping=dict.fromkeys(WEIGHTS, len(calls) // len(WEIGHTS)))
        pipe.execute()
    with LoopbackProvider(WINDOW_S) as provider:
        outs = [tmp / f"{mode}-{n}.json" for n in range(PROCESSES)]
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.quota.fleet", prefix, mode, provider.url, str(out)],
                cwd=ROOT,
            )
            for out in outs
        ]
        try:
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()  # by its own handle: a process this test started
                    p.wait()
        assert codes == [0] * PROCESSES
        book = provider.book
    results = [json.loads(out.read_text()) for out in outs]
    records = sorted((r for res in results for r in res["records"]), key=lambda r: r[0])
    return {
        "records": records,
        "refused": sum(res["refused"] for res in results),
        "per_process": [len(res["records"]) for res in results],
        "submitted": {tid for _, tid, _, _ in calls},
        "book": book,
    }


def shares_while_all_backlogged(records: list[list[Any]]) -> tuple[dict[str, float], int]:
    charge = dict.fromkeys(WEIGHTS, 0)
    counted = 0
    for _, _, tenant, amount, depths, _ in records:
        if min(depths) == 0:
            break
        charge[tenant] += amount
        counted += 1
    total = sum(charge.values())
    return {t: 100 * c / total for t, c in charge.items()}, counted


def weight_share(tenant: str) -> float:
    return 100 * WEIGHTS[tenant] / sum(WEIGHTS.values())


def test_two_admitter_processes_share_by_weight_within_the_gates(
    redis_client: redis.Redis, key_prefix: str, tmp_path: Path
) -> None:
    drr = run(redis_client, f"{key_prefix}-drr", "drr", tmp_path)
    records = drr["records"]
    ids = [r[1] for r in records]
    assert len(ids) == 10_000 and len(set(ids)) == 10_000 and set(ids) == drr["submitted"]
    assert all(n > 0 for n in drr["per_process"])  # both processes admitted
    # at every admission, the counters the claim script returned after its own debit
    for seq, tid, _, _, _, (requests, tokens, leases, rpm, tpm, conc) in records:
        assert (rpm, tpm, conc) == (RPM, TPM, CONCURRENCY)
        assert requests <= rpm and tokens <= tpm and leases <= conc, (seq, tid)
    refused_share = drr["refused"] / (drr["refused"] + len(records))
    assert refused_share >= 0.20
    book = drr["book"]
    assert book.served == 10_000 and book.repeats == 0
    assert book.max_in_flight <= CONCURRENCY
    assert book.max_requests <= RPM and book.max_tokens <= TPM
    shares, counted = shares_while_all_backlogged(records)
    assert counted >= 5_000
    errors = {t: abs(shares[t] - weight_share(t)) for t in WEIGHTS}
    assert max(errors.values()) <= 1.0, (shares, counted)

    fifo = run(redis_client, f"{key_prefix}-fifo", "fifo", tmp_path)
    assert len({r[1] for r in fifo["records"]}) == 10_000
    assert fifo["book"].max_in_flight <= CONCURRENCY and fifo["book"].max_requests <= RPM
    fifo_shares, fifo_counted = shares_while_all_backlogged(fifo["records"])
    assert fifo_counted >= 5_000
    assert max(abs(fifo_shares[t] - weight_share(t)) for t in WEIGHTS) > 1.0
    print(
        json.dumps(
            {
                "drr_shares_pct": {t: round(s, 3) for t, s in shares.items()},
                "drr_max_error_pct_pt": round(max(errors.values()), 3),
                "drr_admissions_measured": counted,
                "gate_refused_share": round(refused_share, 3),
                "provider_max": [book.max_in_flight, book.max_requests, book.max_tokens],
                "fifo_shares_pct": {t: round(s, 3) for t, s in fifo_shares.items()},
                "fifo_admissions_measured": fifo_counted,
            }
        )
    )
