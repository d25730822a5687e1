"""The dispatch loop's decisions: gates, lost races, runs ended or paused at admission, FIFO."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from kernel.errors import StaleNomination
from kernel.states import LifecycleState, StopReason
from router.admission.fifo import FifoAdmitter
from router.admission.tenants import AdmissionConfig
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders

pytestmark = pytest.mark.redis
S = LifecycleState


@pytest.mark.parametrize("admitter", ["redis", "drr", "fifo"])
def test_the_provider_gate_bounds_the_turns_in_flight(
    admitter: str,
    redis_client: redis.Redis,
    key_prefix: str,
    tenants_file: Path,
    gates_file: Path,
) -> None:
    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, admitter=admitter, gates_file=str(gates_file)
    )
    orders = seed_orders(redis_client, key_prefix, 100, 10)
    for i, oid in enumerate(orders):
        fleet.api.submit(("acme", "globex", "initech")[i % 3], refund_job(oid))
    fleet.cycle()
    first = fleet.take()
    assert len(first) == 6, "the gate's concurrency is 6"
    fleet.cycle()
    assert fleet.take() == [], "nothing more until a turn ends"
    fleet.runner.run(first[0])  # its notice settles the lease
    fleet.cycle()
    assert len(fleet.take()) == 1
    assert all(m.lease for m in first), "each turn carries its gate lease back"


def test_a_run_that_cannot_continue_ends_at_admission_and_nothing_is_sent(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 200, 1)[0]
    tid = inproc.api.submit("acme", {**refund_job(oid), "budget": {"max_steps": 0}}).trajectory_id
    inproc.cycle()
    assert inproc.take() == []
    rec = inproc.load("acme", tid)
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_STEPS
    assert not inproc.service.dispatcher.admitter.is_queued(tid)


def test_a_trajectory_paused_while_queued_is_withdrawn_and_resumes(
    inproc: InProcessFleet,
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 300, 1)[0]
    tid = inproc.api.submit("globex", refund_job(oid)).trajectory_id
    ack = inproc.api.control("globex", tid, "pause", "ops")
    assert ack["admission_stopped"] and ack["state"] == "PAUSED"
    inproc.cycle()
    assert inproc.take() == [] and not inproc.service.dispatcher.admitter.is_queued(tid)
    inproc.api.control("globex", tid, "resume", "ops")
    inproc.run_until_quiet()
    assert inproc.load("globex", tid).stop_reason is StopReason.DONE


def test_a_lost_race_at_admission_declines_and_the_pause_wins(
    inproc: InProcessFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    oid = seed_orders(inproc.client, inproc.prefix, 400, 1)[0]
    tid = inproc.api.submit("initech", refund_job(oid)).trajectory_id
    store = inproc.service.dispatcher.store
    real_load = store.load

    def load_then_pause(tenant: str, trajectory_id: str):  # type: ignore[no-untyped-def]
        rec = real_load(tenant, trajectory_id)
        monkeypatch.setattr(store, "load", real_load)
        inproc.api.control(tenant, trajectory_id, "pause", "ops")  # lands before the CAS
        return rec

    monkeypatch.setattr(store, "load", load_then_pause)
    inproc.cycle()
    assert inproc.take() == []
    assert inproc.service.dispatcher.figures.declined == 1
    rec = inproc.load("initech", tid)
    assert rec.state is S.PAUSED and rec.turn == 0, "the admission never happened"
    inproc.cycle()
    assert inproc.take() == [] and not inproc.service.dispatcher.admitter.is_queued(tid)


def test_fifo_admits_in_arrival_order_across_tenants(tenants_file: Path) -> None:
    fifo = FifoAdmitter(AdmissionConfig.from_file(tenants_file), lambda: 0.0)
    for i, tenant in enumerate(["initech", "acme", "initech", "globex"]):
        fifo.requeue(tenant, f"t{i}", input_tokens=100, output_allowance=300)
    assert fifo.depths() == [1, 1, 2]
    order = []
    while (nom := fifo.nominate()) is not None:
        fifo.decline(nom)  # head-of-line: a declined head stays the head
        assert fifo.nominate().call is nom.call  # type: ignore[union-attr]
        fifo.confirm(nom)
        order.append(nom.call.trajectory_id)
    assert order == ["t0", "t1", "t2", "t3"]
    fifo.requeue("acme", "t9", input_tokens=1, output_allowance=1)
    nom = fifo.nominate()
    assert nom is not None and fifo.withdraw("t9")
    with pytest.raises(StaleNomination):
        fifo.confirm(nom)


def test_a_call_that_can_never_be_admitted_is_finalized_at_once(inproc: InProcessFleet) -> None:
    from router.admission.queue import FinalizeNow
    from router.wire.notices import Notice, NoticeKind

    oid = seed_orders(inproc.client, inproc.prefix, 400, 1)[0]
    tid = inproc.api.submit("acme", refund_job(oid)).trajectory_id
    dispatcher = inproc.service.dispatcher
    notice = Notice(kind=NoticeKind.READY, tenant="acme", trajectory_id=tid, version=1)
    dispatcher._requeued(notice, FinalizeNow(tid, StopReason.MAX_TOKENS, "next call too large"))
    rec = inproc.load("acme", tid)
    assert rec.state is S.FAILED and rec.stop_reason is StopReason.MAX_TOKENS
    assert rec.closing_message is not None


@pytest.mark.parametrize("gather_s", [0.005, 0.0])
def test_a_router_woken_by_an_ended_turn_gathers_the_turns_ending_meanwhile(
    inproc: InProcessFleet, monkeypatch: pytest.MonkeyPatch, gather_s: float
) -> None:
    service = inproc.service
    service.settings = service.settings.model_copy(update={"router_gather_s": gather_s})
    orders = seed_orders(inproc.client, inproc.prefix, 300, 3)
    ids = [inproc.api.submit("acme", refund_job(oid)).trajectory_id for oid in orders]
    inproc.cycle()
    first, *rest = inproc.take()
    assert {first.trajectory_id, *(m.trajectory_id for m in rest)} == set(ids)
    inproc.runner.run(first)  # its READY notice wakes the router
    waited: list[float] = []

    def turns_end_meanwhile(timeout: float | None = None) -> bool:
        waited.append(timeout or 0.0)
        for msg in rest:  # the other two turns end while the router gathers
            inproc.runner.run(msg)
        return False

    monkeypatch.setattr(service._stop, "wait", turns_end_meanwhile)
    requeued = service.dispatcher.figures.requeued
    service.cycle(block_s=0.05)
    admitted = inproc.take()
    if gather_s:
        assert waited == [gather_s]
        assert service.dispatcher.figures.requeued - requeued == 3
        assert {m.trajectory_id for m in admitted} == set(ids), "one cycle admitted all three"
    else:
        assert waited == [], "no gathering: the cycle admits what woke it"
        assert [m.trajectory_id for m in admitted] == [first.trajectory_id]
