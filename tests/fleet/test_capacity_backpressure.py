"""A tool gate at capacity 1 and five refunds at once (issue 38, item 3): capacity shortage is
backpressure. Turns run on five threads of one worker against the real Redis; the first refund
holds the gate's one slot until the test lets it go, and the others wait for it, unsent, with
the gate named in their records, in the API's view and in what ``reins show`` prints. No run
fails or counts an error for capacity, and every one ends done."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest
import redis

from api.views import trajectory_of
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.chain import RowKind
from kernel.states import LifecycleState, StopReason
from kernel.tools import ToolBackend
from ops.cli import client as cli
from router.admission.gates import GateConfig, MemoryGates
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from worker.leases import LeaseKeeper
from worker.tool_gates import ToolGates, tool_route
from worker.turn import TurnReport

pytestmark = pytest.mark.redis
S = LifecycleState
GATE = tool_route("issue_refund")
RUNS = 5
BOUND_S = 60.0


class HeldRefunds:
    """The support store, whose refunds wait until ``release`` is set (at most ``BOUND_S``)."""

    def __init__(self, inner: ToolBackend, release: threading.Event) -> None:
        self.inner, self.release = inner, release
        self.refunding = threading.Event()  # a refund is in the backend now

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
        if tool == "issue_refund":
            self.refunding.set()
            assert self.release.wait(BOUND_S), "the test never let the refund go"
        return self.inner.call(user, tool, args, key, timeout_s, approval, fence=fence)

    def lookup(self, tool: str, key: str, *, fence: int) -> tuple[dict[str, Any], float]:
        return self.inner.lookup(tool, key, fence=fence)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Lets the held refunds go; set at teardown whatever happened, so every thread ends."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def pool(release: threading.Event) -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=RUNS + 2, thread_name_prefix="turn") as threads:
        yield threads
        release.set()  # before the pool waits for its threads


def test_a_tool_gate_at_capacity_1_holds_five_runs_back_without_an_error(
    redis_client: redis.Redis,
    key_prefix: str,
    tenants_file: Path,
    pool: ThreadPoolExecutor,
    release: threading.Event,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = GateConfig.from_mapping({"routes": {GATE: {"concurrency": 1, "lease_ttl_s": 30}}})
    gates = MemoryGates(config, time.monotonic)
    tool_gates = ToolGates(gates, LeaseKeeper(gates, time.monotonic), lambda r: 30.0, recheck_s=0.1)
    backends: list[HeldRefunds] = []

    def backend(state: RedisState) -> ToolBackend:
        backends.append(HeldRefunds(SupportStoreBackend(state), release))
        return backends[-1]

    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, backend=backend, tool_gates=tool_gates
    )
    orders = seed_orders(redis_client, key_prefix, 3800, RUNS)
    ids = [fleet.api.submit("acme", refund_job(oid)).trajectory_id for oid in orders]
    running: set[Future[TurnReport]] = set()

    def drive(until: Any) -> None:
        """Admit and run turns on the pool until ``until()`` holds (bounded)."""
        deadline = time.monotonic() + BOUND_S
        while not until():
            assert time.monotonic() < deadline, "not reached within the bound"
            fleet.cycle()
            for msg in fleet.take():
                running.add(pool.submit(fleet.runner.run, msg))
            done, _ = wait(running, timeout=0.05, return_when=FIRST_COMPLETED)
            for turn in done:
                running.discard(turn)
                turn.result()  # a turn that raised fails the test here

    def waiting() -> list[str]:
        recs = [fleet.load("acme", t) for t in ids]
        return [r.trajectory_id for r in recs if any(op.waiting for op in r.operations.values())]

    drive(lambda: len(waiting()) == RUNS - 1)
    assert backends[0].refunding.is_set(), "one refund holds the slot"
    tid = waiting()[0]
    rec = fleet.load("acme", tid)
    assert rec.state is S.WAITING_TOOL
    shown = trajectory_of(rec).model_dump()
    assert shown["waiting"] == [
        {"call_id": shown["waiting"][0]["call_id"], "tool": "issue_refund", "on": GATE}
    ], "the API names the gate it waits for"
    cli.print_shown(shown)  # what `reins show` prints of it
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"waiting: issue_refund ({shown['waiting'][0]['call_id']}) for capacity on {GATE}" in (
        printed
    )

    release.set()
    drive(lambda: all(fleet.load("acme", t).state not in (S.READY, S.WAITING_TOOL) for t in ids))
    drive(lambda: not running)
    records = [fleet.load("acme", t) for t in ids]
    assert [r.stop_reason for r in records] == [StopReason.DONE] * RUNS, "all finish"
    rows = [row for t in ids for row in fleet.store.read("acme", t)]
    tool_rows = [r for r in rows if r.kind is RowKind.TOOL]
    assert not [r for r in tool_rows if r.error == "no_capacity" or r.outcome == "error"], (
        "no run sees an error for capacity"
    )
    assert sum(r.outcome == "waiting" for r in tool_rows) == RUNS - 1, "one row per wait"
    assert all(op.waiting is None for r in records for op in r.operations.values())
