"""A killed admitter's concurrency leases expire and the capacity returns; its uncommitted claim
is reaped back to its queue. The holder runs in its own process, killed with SIGKILL by PID.

Nothing here sleeps to wait for time: every wait is a bounded poll of a condition.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from router.admission.gates import GateReading
from tests.quota.holder import HELD, ROUTE, admitter
from tests.support import wait_for

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]


def test_a_killed_admitters_leases_expire_and_capacity_returns(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    adm = admitter(redis_client, key_prefix)
    gates = adm.gates
    assert gates is not None
    gates.configure()
    for k in range(HELD + 2):
        adm.submit("acme", f"t{k}", input_tokens=2_000, output_allowance=500, route=ROUTE)
    proc = subprocess.Popen([sys.executable, "-m", "tests.quota.holder", key_prefix], cwd=ROOT)

    def renewed(times: int) -> Callable[[], bool]:
        return lambda: int(redis_client.get(f"{key_prefix}:holder-renewals") or 0) >= times

    try:
        wait_for(lambda: redis_client.exists(f"{key_prefix}:holder-ready") == 1, 30, "the holder")
        # live: its leases outlast several lease lengths because it renews them
        wait_for(renewed(12), 30, "12 renewals by the holder")
        held: GateReading = gates.reading(ROUTE)
        # the committed calls' leases are held; the uncommitted claim's lapsed (nobody renews it)
        assert (held.leases, held.requests) == (HELD, HELD + 1)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # no renewals: every lease lapses
    wait_for(lambda: gates.reading(ROUTE).leases == 0, 30, "the leases to lapse", every_s=0.01)
    probes = [gates.debit(ROUTE, f"probe{n}", 100) for n in range(HELD + 2)]
    assert [p.ok for p in probes] == [True] * (HELD + 1) + [False]  # all of it is back
    for n in range(HELD + 1):
        gates.release(ROUTE, f"probe{n}")
    # the claim it never committed goes back to READY once its deadline has passed
    requeued: list[str] = []

    def reconciled() -> bool:
        requeued.extend(adm.reconcile(lambda tenant, tid: True).requeued)
        return bool(requeued)

    wait_for(reconciled, 30, "the uncommitted claim to be requeued", every_s=0.01)
    assert requeued == [f"t{HELD}"]
    claim = adm.nominate()
    assert claim is not None and claim.call.trajectory_id == f"t{HELD}"
