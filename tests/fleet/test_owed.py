"""What a killed run still owes is settled in the fleet: the router's reconciler delivers
``Reconcile``, the lookup goes to a worker like any tool call, and the ledger closes.

The refund's worker dies between the backend's effect and the commit of its result (or its
message is lost before it runs); an operator kills the run, so the write's outcome is unknown
and the reconciler owns it. Nothing is sent again: the lookup finds the effect (settled at
its charge) or finds it absent (settled without effect, and the lookup's fence shuts out the
write that was never carried out).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from kernel.events import DispatchTool, LookupEffect
from kernel.record import ControlKind, OpStatus, SettlementOwner
from kernel.states import LifecycleState, StopReason
from router.fleet.observe import RouterObserver
from router.process.owed import OwedRuns
from router.wire.turns import TurnMessage
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.support.clock import ManualClock

pytestmark = pytest.mark.redis
S = LifecycleState
TENANT = "globex"


class DiesInTheRefund(BaseException):
    """The worker process ends while the refund is on the wire."""


def killed_with_the_refund_in_flight(
    inproc: InProcessFleet, order: int, *, applied: bool
) -> tuple[str, str, DispatchTool]:
    """Run the job until its refund is sent and its worker dies (``applied``: after the
    backend carried it out; otherwise before it left), then kill it. Returns the trajectory,
    the order and the refund's dispatch, as the record registered it."""
    oid = seed_orders(inproc.client, inproc.prefix, order, 1)[0]
    tid = inproc.api.submit(TENANT, refund_job(oid)).trajectory_id
    backend = inproc.backend
    real_call = backend.call

    def dies(user: str, tool: str, args: dict[str, Any], key: str, *a: Any, **kw: Any) -> Any:
        if tool != "issue_refund":
            return real_call(user, tool, args, key, *a, **kw)
        if applied:
            real_call(user, tool, args, key, *a, **kw)
        raise DiesInTheRefund

    backend.call = dies  # type: ignore[method-assign]
    died = False
    try:
        for _ in range(10):
            inproc.cycle()
            for msg in inproc.take():
                try:
                    inproc.runner.run(msg)
                except DiesInTheRefund:
                    died = True
            if died:
                break
    finally:
        backend.call = real_call  # type: ignore[method-assign]
    assert died
    rec = inproc.load(TENANT, tid)
    assert rec.state is S.WAITING_TOOL, "the refund was registered before it was sent"
    op = next(o for o in rec.operations.values() if o.tool == "issue_refund")
    dispatch = DispatchTool(
        call_id=op.call_id,
        attempt_id=op.attempts[-1],
        tool="issue_refund",
        args=op.args or {},
        idempotency_key=op.idempotency_key,
        timeout_s=30.0,
        fence=rec.record_version,
    )
    ack = inproc.api.control(TENANT, tid, ControlKind.KILL, "ops@globex")
    assert ack["outstanding"] == [op.call_id]
    rec = inproc.load(TENANT, tid)
    assert rec.stop_reason is StopReason.KILLED
    op = rec.operations[op.call_id]
    assert op.status is OpStatus.UNKNOWN and op.settlement_owner is SettlementOwner.RECONCILER
    assert inproc.store.owing(TENANT) == [tid], "listed by the commit that ended it"
    return tid, oid, dispatch


class OwedCounts(RouterObserver):
    """What the reconciler reports of the owing runs, each sweep."""

    def __init__(self) -> None:
        self.seen: list[dict[str, int]] = []

    def on_owed_runs(self, owing: Mapping[str, int]) -> None:
        self.seen.append(dict(owing))


def reconcile(inproc: InProcessFleet, tid: str) -> list[TurnMessage]:
    """The router's reconciler passes over the tenant; its lookups reach the worker; the
    next sweep finds nothing owed."""
    clock, counts = ManualClock(), OwedCounts()
    owed = OwedRuns(inproc.api, (TENANT,), after_s=30.0, clock=clock, observer=counts)
    assert owed.sweep() == [], "first seen: late evidence has its time first"
    assert inproc.take() == []
    clock.advance(31.0)
    delivered: list[float] = []
    deliver = inproc.api.deliver

    def seen(tenant: str, trajectory_id: str, event: Any) -> Any:
        delivered.append(event.now)
        return deliver(tenant, trajectory_id, event)

    inproc.api.deliver = seen  # type: ignore[method-assign]
    before = inproc.api.clock()
    assert owed.sweep() == [tid]
    after = inproc.api.clock()
    inproc.api.deliver = deliver  # type: ignore[method-assign]
    # The event's time (what its chain rows carry) is the fleet's wall clock, not the sweep's
    # own schedule: a record stamped with a monotonic time looked decades old to retention.
    assert delivered and all(before <= now <= after for now in delivered), delivered
    sent = inproc.take()
    assert [type(c) for m in sent for c in m.commands] == [LookupEffect]
    for msg in sent:
        inproc.runner.run(msg)
    assert owed.sweep() == []
    assert counts.seen == [{TENANT: 1}, {TENANT: 1}, {TENANT: 0}], "the gauge follows the list"
    return sent


def test_a_killed_write_that_took_effect_is_found_by_the_reconciler_and_closes(
    inproc: InProcessFleet,
) -> None:
    tid, oid, dispatch = killed_with_the_refund_in_flight(inproc, 800, applied=True)
    held = inproc.load(TENANT, tid).ledger.reservations
    assert dispatch.attempt_id in held, "killed: the reservation stays with its owner"
    reconcile(inproc, tid)
    rec = inproc.load(TENANT, tid)
    op = rec.operations[dispatch.call_id]
    assert op.status is OpStatus.SETTLED and op.evidence is not None
    assert op.evidence["reconciled"] == "found"
    assert rec.ledger.reservations == {}, "the ledger closes"
    assert rec.state is S.CANCELED and rec.stop_reason is StopReason.KILLED
    assert inproc.store.owing(TENANT) == []
    rows = [r for r in inproc.store.read(TENANT, tid) if r.outcome == "reconciled"]
    assert [(r.call_id, r.detail["effect"]) for r in rows] == [(dispatch.call_id, "found")]
    effects = Counter(tuple(e) for e in inproc.state.effects())
    assert effects[("refund", oid, 3000)] == 1, "found, never sent again"


def test_a_killed_write_that_never_ran_is_settled_absent_and_stays_undone(
    inproc: InProcessFleet,
) -> None:
    tid, oid, dispatch = killed_with_the_refund_in_flight(inproc, 810, applied=False)
    reconcile(inproc, tid)
    rec = inproc.load(TENANT, tid)
    op = rec.operations[dispatch.call_id]
    assert op.evidence is not None and op.evidence["reconciled"] == "absent"
    assert rec.ledger.reservations == {} and inproc.store.owing(TENANT) == []
    # A worker that wakes and sends it now is refused by the backend: the lookup's fence is
    # newer than the attempt's, so "absent" stays true.
    out, _ = inproc.backend.call(
        "cu_ana",
        dispatch.tool,
        dispatch.args,
        dispatch.idempotency_key,
        dispatch.timeout_s,
        fence=dispatch.fence,
    )
    assert out["status"] == "error" and inproc.state.fenced_writes() == 1
    assert ("refund", oid, 3000) not in {tuple(e) for e in inproc.state.effects()}
