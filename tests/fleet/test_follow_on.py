"""Follow-on turns on the real Redis: the worker that ended a turn READY admits the next one
itself when the shared admitter would pick it next (worker.follow_on).

In one process, without Celery: the router's sender collects turn messages and the test hands
them to the turn runner, which admits the follow-on turns in the same call.
"""

from __future__ import annotations

import math
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from examples.support_store.state import RedisState
from kernel.settings import Settings
from kernel.states import LifecycleState, StopReason
from router.admission.gates import GateConfig
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.claims import store_readiness
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig
from router.fleet import config as fleet_config
from router.fleet.config import ConfigSource
from router.wire.custody import Custody
from router.wire.feed import Feed
from store.redis_store import RedisStore
from tests.conftest import REDIS_URL
from tests.fleet.conftest import ROUTE
from tests.fleet.documents import fleet_document
from tests.fleet.harness import InProcessFleet, refund_job, seed_orders
from tests.fleet.processes import effects_by_order, order_of
from tests.support import ManualClock
from worker import follow_on as follow_on_module

pytestmark = pytest.mark.redis


def admitted_by(fleet: InProcessFleet) -> Counter[str]:
    """Who admitted how many turns (the router's entries are written at its next tick)."""
    fleet.service.dispatcher.flush()
    return Counter(a["r"] for a in fleet.feed.admissions())


def gated(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path, turns: int
) -> tuple[InProcessFleet, follow_on_module.FollowOn]:
    """A fleet with provider gates whose worker admits up to ``turns`` follow-on turns."""
    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, gates_file=str(gates_file), follow_on_turns=turns
    )
    assert fleet.follow_on is not None
    return fleet, fleet.follow_on


def test_an_uncontended_trajectory_runs_every_turn_from_one_message(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path
) -> None:
    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, gates_file=str(gates_file), follow_on_turns=16
    )
    oid = seed_orders(redis_client, key_prefix, 2100, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    messages = fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.stop_reason is StopReason.DONE and rec.turn >= 3
    assert messages == 1, "one Celery message; the worker admitted the other turns"
    assert admitted_by(fleet) == Counter(r1=1, w1=rec.turn - 1)
    effects = effects_by_order(RedisState(redis_client, key_prefix, seed=False).effects())
    assert effects[order_of(rec)] == Counter(refund=1, email=1)
    admitter: Any = fleet.service.dispatcher.admitter
    assert sum(n for n, _ in admitter.admitted()) == rec.turn, "every admission in the books"
    assert fleet.custody.entrusted_to("w1") == [], "the last turn's holding was released"
    gates = RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix)
    reading = gates.reading(ROUTE)
    assert reading.leases == 0, "every turn's gate lease was settled"
    assert reading.requests == rec.turn, "one debit per model call"


def test_a_message_allows_at_most_its_follow_on_turns(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, follow_on_turns=1)
    oid = seed_orders(redis_client, key_prefix, 2200, 1)[0]
    tid = fleet.api.submit("globex", refund_job(oid)).trajectory_id
    messages = fleet.run_until_quiet()
    rec = fleet.load("globex", tid)
    assert rec.stop_reason is StopReason.DONE
    assert messages == math.ceil(rec.turn / 2), (messages, rec.turn)
    assert admitted_by(fleet) == Counter(r1=messages, w1=rec.turn - messages)


def test_routers_with_a_local_admitter_allow_no_follow_on_turn(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(
        redis_client, key_prefix, tenants_file, admitter="fifo", follow_on_turns=16
    )
    oid = seed_orders(redis_client, key_prefix, 2300, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    fleet.cycle()
    (msg,) = fleet.take()
    assert msg.follow_on == 0, "only the shared admitter's order may be kept by a worker"
    fleet.runner.run(msg)
    messages = fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.stop_reason is StopReason.DONE and messages + 1 == rec.turn


def test_a_draining_worker_admits_no_follow_on_turn(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, follow_on_turns=16)
    fleet.draining = True
    oid = seed_orders(redis_client, key_prefix, 2400, 1)[0]
    tid = fleet.api.submit("initech", refund_job(oid)).trajectory_id
    messages = fleet.run_until_quiet()
    assert messages == fleet.load("initech", tid).turn
    assert fleet.follow_on is not None and fleet.follow_on.admitted == 0


def test_a_pause_that_lands_before_the_follow_on_admission_wins(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, follow_on_turns=16)
    follow_on = fleet.follow_on
    assert follow_on is not None
    oid = seed_orders(redis_client, key_prefix, 2500, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    admit = follow_on.admit
    paused: list[int] = []

    def pause_first(*args: Any) -> Any:  # an operator's pause lands before the admission
        if not paused:
            fleet.api.control("acme", tid, "pause", "ops")
            paused.append(fleet.load("acme", tid).turn)
        return admit(*args)

    follow_on.admit = pause_first  # type: ignore[method-assign]
    fleet.cycle()
    (msg,) = fleet.take()
    report = fleet.runner.run(msg)
    # The turn's last outcome waited to be committed with the admission: it lost to the pause,
    # and was stepped again and committed on the paused record, which it leaves PAUSED.
    assert report.outcome.value == "idle", "the next turn was not admitted"
    fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.state is LifecycleState.PAUSED
    assert rec.turn == paused[0] == 1, "no model call after the pause"
    assert follow_on.admitted == 0 and follow_on.passed == 1
    assert admitted_by(fleet) == Counter(r1=1)
    assert fleet.custody.entrusted_to("w1") == [], "the holding written for the lost admission went"
    admitter: Any = fleet.service.dispatcher.admitter
    assert not admitter.is_queued(tid), "the declined call was taken and withdrawn by a router"


def test_a_follow_on_turn_is_held_with_its_admission(
    redis_client: redis.Redis,
    key_prefix: str,
    tenants_file: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The holding goes in the admission's round trip, ahead of its compare-and-set (the
    store's ``before``), so the reconciler finds every turn a dead worker admitted."""
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, follow_on_turns=16)
    oid = seed_orders(redis_client, key_prefix, 2600, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    seen: list[tuple[int, int, str]] = []
    real_commit = follow_on_module.commit

    def commit(store: Any, rec: Any, result: Any, *rest: Any, **kw: Any) -> None:
        real_commit(store, rec, result, *rest, **kw)
        if result.record.state is LifecycleState.CALLING_MODEL:  # an admission
            (held,) = fleet.custody.entrusted_to("w1")
            seen.append((held.version, result.record.record_version, held.call_id))
            assert held.call_id == f"{tid}/m{result.record.turn}"

    monkeypatch.setattr(follow_on_module, "commit", commit)
    fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.stop_reason is StopReason.DONE
    assert len(seen) == rec.turn - 1, "every follow-on admission"
    assert all(held == admitted for held, admitted, _ in seen), seen


def test_a_run_that_cannot_continue_ends_at_its_follow_on_admission(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path
) -> None:
    fleet = InProcessFleet(redis_client, key_prefix, tenants_file, follow_on_turns=16)
    oid = seed_orders(redis_client, key_prefix, 2700, 1)[0]
    job = {**refund_job(oid), "budget": {"max_steps": 2}}
    tid = fleet.api.submit("acme", job).trajectory_id
    messages = fleet.run_until_quiet()
    rec = fleet.load("acme", tid)
    assert rec.state is LifecycleState.FAILED and rec.stop_reason is StopReason.MAX_STEPS
    assert rec.turn == 2 and messages == 1, "the second turn followed on; the third never began"
    assert fleet.follow_on is not None and fleet.follow_on.admitted == 1
    admitter: Any = fleet.service.dispatcher.admitter
    assert not admitter.is_queued(tid), "the claim was withdrawn with its debit"
    assert fleet.custody.entrusted_to("w1") == [], "no holding outlives the run"
    assert admitted_by(fleet) == Counter(r1=1, w1=1)


def test_a_claim_reaped_before_its_commit_is_debited_again_before_the_call(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path
) -> None:
    fleet, follow_on = gated(redis_client, key_prefix, tenants_file, gates_file, 1)
    clock = ManualClock(time.time())
    gates = RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix)
    admitter = RedisAdmitter(
        redis_client,
        AdmissionConfig.from_file(str(tenants_file)),
        prefix=key_prefix,
        gates=gates,
        clock=clock,
    )
    follow_on.admitter = admitter
    reaped: list[Any] = []
    guarded = admitter.confirm_committed

    def reaped_first(claim: Any, *args: Any) -> Any:  # the claim outlives its deadline first
        clock.advance(3600)
        reaped.append(admitter.reconcile(store_readiness(fleet.store)))
        return guarded(claim, *args)

    admitter.confirm_committed = reaped_first  # type: ignore[method-assign]
    debits: list[str] = []
    debit = gates.debit

    def counted(route: str, lease: str, tokens: int) -> Any:
        debits.append(lease)
        return debit(route, lease, tokens)

    follow_on.gates.debit = counted  # type: ignore[method-assign]
    oid = seed_orders(redis_client, key_prefix, 2800, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    fleet.cycle()
    (msg,) = fleet.take()
    fleet.runner.run(msg)
    assert len(reaped) == 1 and reaped[0].dropped == (tid,), "the reconciler dropped the claim"
    assert len(debits) == 1, "debited again under the claim's id before the model call"
    rec = fleet.load("acme", tid)
    assert rec.turn == 2, "the follow-on turn ran"
    assert gates.reading(ROUTE).requests >= 2, "both model calls counted at the gate"


def test_a_guarded_confirmation_answered_in_error_is_confirmed_on_its_own(
    redis_client: redis.Redis, key_prefix: str, tenants_file: Path, gates_file: Path
) -> None:
    fleet, follow_on = gated(redis_client, key_prefix, tenants_file, gates_file, 16)
    admitter: Any = follow_on._admitter_now()  # built from the document the file became
    guarded = admitter.confirm_committed
    answered_in_error: list[bool] = []

    def refused(claim: Any, mark: Any, figures: Any) -> Any:  # the server refuses the script
        _, finish = guarded(claim, mark, figures)

        def read(reply: Any) -> Any:
            answered_in_error.append(isinstance(reply, Exception))
            return finish(reply)

        return ("HGET", "only-one-argument"), read

    admitter.confirm_committed = refused
    oid = seed_orders(redis_client, key_prefix, 2900, 1)[0]
    tid = fleet.api.submit("acme", refund_job(oid)).trajectory_id
    assert fleet.run_until_quiet() == 1, "every later turn admitted by the worker"
    rec = fleet.load("acme", tid)
    assert rec.stop_reason is StopReason.DONE and rec.turn >= 3
    assert answered_in_error and all(answered_in_error)
    assert admitted_by(fleet) == Counter(r1=1, w1=rec.turn - 1), "each confirmed once"
    assert sum(n for n, _ in admitter.admitted()) == rec.turn, "every admission in the books"
    gates = RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix)
    assert gates.reading(ROUTE).leases == 0, "every turn's gate lease was settled"


def test_without_a_tenants_file_follow_on_turns_admit_by_the_fleet_document(
    redis_client: redis.Redis, key_prefix: str
) -> None:
    """As the chart deploys a worker: no tenants file, the document in Redis. Until one is
    applied the worker leaves READY turns to the routers; then it admits by the document and
    follows its next version."""
    settings = Settings.from_env(
        {"REINS_KEY_PREFIX": key_prefix, "REINS_REDIS_URL": REDIS_URL, "REINS_FOLLOW_ON_TURNS": "8"}
    )
    follow_on = follow_on_module.FollowOn.configured(
        settings,
        worker="w1",
        client=redis_client,
        store=RedisStore(redis_client, prefix=key_prefix),
        gates=RedisGates(redis_client, GateConfig(routes={}), prefix=key_prefix),
        custody=Custody(redis_client, key_prefix),
        feed=Feed(redis_client, key_prefix),
        draining=lambda: False,
        document=ConfigSource(redis_client, key_prefix, refresh_s=0),
    )
    assert follow_on is not None, "a worker without a tenants file still admits follow-ons"
    assert follow_on._admitter_now() is None, "no document yet: the routers admit"

    def weights() -> dict[str, int]:
        admitter = follow_on._admitter_now()
        assert admitter is not None
        return {t.name: t.weight for t in admitter.config.tenants}

    fleet_config.apply(redis_client, key_prefix, tomllib.loads(fleet_document({"acme": 3})))
    assert weights() == {"acme": 3}
    doc = fleet_document({"acme": 1, "globex": 2})
    fleet_config.apply(redis_client, key_prefix, tomllib.loads(doc))
    assert weights() == {"acme": 1, "globex": 2}, "the next version reconfigures it"
