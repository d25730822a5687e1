"""The Redis admitter beyond the shared contract: claims, gates in the claim, the reconciler."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from examples.support_store import make_agent
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.errors import ClaimLapsed, ConfigError, StaleNomination, SubmissionRefused
from kernel.events import Admit
from kernel.states import LifecycleState
from kernel.step import step
from router.admission import drr
from router.admission.claims import AdmissionRecord
from router.admission.drr import ReadyCall
from router.admission.gates import Feedback, GateConfig, MemoryGates
from router.admission.local import Admitter
from router.admission.redis.admitter import Claim, RedisAdmitter, store_readiness
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig
from store.in_process import InProcessStore
from store.redis_store import CommitMark
from tests.kernel.harness import new_record
from tests.support import ManualClock

pytestmark = pytest.mark.redis

OPENAI, ANTHROPIC = "openai/gpt-4o-mini", "anthropic/claude-haiku"
CONFIG = AdmissionConfig.from_mapping(
    {
        "quantum_tokens": 5_000,
        "credit_cap_tokens": 20_000,
        "tenants": [
            {"name": "acme", "weight": 1, "max_ready": 50, "largest_call_tokens": 10_000},
            {"name": "globex", "weight": 1, "max_ready": 50, "largest_call_tokens": 10_000},
        ],
    }
)
GATES = GateConfig.from_mapping(
    {
        "routes": {
            OPENAI: {"rpm": 100, "tpm": 100_000, "concurrency": 2, "lease_ttl_s": 10},
            ANTHROPIC: {"rpm": 100, "tpm": 100_000, "concurrency": 8, "lease_ttl_s": 10},
        }
    }
)
Make = Callable[..., RedisAdmitter]


@pytest.fixture
def make(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Make:
    gates = RedisGates(redis_client, GATES, prefix=key_prefix, clock=clock)
    gates.configure()

    def build(claim_ttl_s: float = 30.0) -> RedisAdmitter:
        return RedisAdmitter(
            redis_client,
            CONFIG,
            prefix=key_prefix,
            clock=clock,
            gates=gates,
            claim_ttl_s=claim_ttl_s,
        )

    return build


def fill(
    admitter: RedisAdmitter,
    per_tenant: int = 4,
    route: str = OPENAI,
    tenants: tuple[str, ...] = ("acme", "globex"),
) -> None:
    for tenant in tenants:
        for k in range(per_tenant):
            admitter.submit(
                tenant, f"{tenant}-{k}", input_tokens=2_000, output_allowance=500, route=route
            )


def claimed(admitter: RedisAdmitter) -> Claim:
    claim = admitter.nominate()
    assert claim is not None
    return claim


def test_two_admitters_never_hold_the_same_call(make: Make) -> None:
    first, second = make(), make()
    fill(first, route="")
    a, b = claimed(first), claimed(second)
    assert a.call.trajectory_id != b.call.trajectory_id
    assert first.is_queued(a.call.trajectory_id)  # claimed, not yet confirmed
    second.confirm(b)
    first.decline(a)  # back at the head of acme's queue, for any replica
    with pytest.raises(StaleNomination):
        first.confirm(a)  # a claim ends once
    order = []
    while (claim := second.nominate()) is not None:
        second.confirm(claim)
        order.append(claim.call.trajectory_id)
    assert [t for t in order if t.startswith("acme")] == ["acme-0", "acme-2", "acme-3"]
    assert sorted([*order, b.call.trajectory_id]) == sorted(
        f"{t}-{k}" for t in ("acme", "globex") for k in range(4)
    )
    with pytest.raises(ClaimLapsed):
        first.confirm(b)  # committed already, through the other admitter
    assert first.admitted() == [(4, 10_000), (4, 10_000)]


def test_a_gated_call_stays_ready_and_other_routes_go_on(make: Make) -> None:
    admitter = make()
    fill(admitter, per_tenant=3, route=OPENAI, tenants=("acme",))
    admitter.submit(
        "globex", "g-anthropic", input_tokens=2_000, output_allowance=500, route=ANTHROPIC
    )
    held = [claimed(admitter), claimed(admitter)]  # concurrency 2 on OPENAI
    assert [c.gate.leases for c in held if c.gate] == [1, 2]
    attempt = admitter.claim()
    assert attempt.claim is not None and attempt.claim.call.route == ANTHROPIC
    depth_before = [t.queue_depth for t in admitter.figures().tenants]
    blocked = admitter.claim()
    assert blocked.claim is None and blocked.reason == "concurrency"
    assert [t.queue_depth for t in admitter.figures().tenants] == depth_before  # still READY
    assert admitter.gates is not None
    admitter.confirm(held[0])
    admitter.gates.settle(OPENAI, held[0].claim_id, 2_300)  # the reply came back: slot free
    assert admitter.nominate() is not None


def test_a_429_stops_admission_for_its_provider_for_that_long(
    make: Make, clock: ManualClock
) -> None:
    admitter = make()
    assert admitter.gates is not None
    fill(admitter, per_tenant=2, route=OPENAI, tenants=("acme",))
    # another tenant's call on another provider (within one tenant's queue calls stay FIFO)
    admitter.submit(
        "globex", "g-anthropic", input_tokens=2_000, output_allowance=500, route=ANTHROPIC
    )
    first = claimed(admitter)
    assert first.call.route == OPENAI
    admitter.confirm(first)
    admitter.gates.after_reply(
        OPENAI,
        first.claim_id,
        used_tokens=None,
        rate_limits={"retry-after": "20"},
        retry_after_s=20.0,
        now_wall=0.0,
    )
    routes = []
    while (claim := admitter.nominate()) is not None:
        routes.append(claim.call.route)
        admitter.confirm(claim)
    assert routes == [ANTHROPIC]  # OpenAI calls wait READY while the provider asked us to
    clock.advance(19.9)
    assert admitter.claim().reason == "paused"
    clock.advance(0.1)
    resumed = admitter.nominate()
    assert resumed is not None and resumed.call.route == OPENAI


def test_header_feedback_lowers_headroom_through_the_claim(make: Make) -> None:
    admitter = make()
    assert admitter.gates is not None
    fill(admitter, per_tenant=2, route=ANTHROPIC)
    admitter.gates.observe(ANTHROPIC, Feedback(remaining_tokens=6_000, reset_s=30))
    admitted = []
    while (claim := admitter.nominate()) is not None:
        admitted.append(claim)
        admitter.confirm(claim)
    assert len(admitted) == 2  # 2 x 2,500 fit in 6,000; tpm alone would allow all four
    assert admitter.claim().reason == "remaining_tokens"


def test_submissions_for_unknown_or_impossible_routes_are_refused(make: Make) -> None:
    admitter = make()
    with pytest.raises(SubmissionRefused, match="no gate for route 'mistral/large'"):
        admitter.submit("acme", "x", input_tokens=1, output_allowance=1, route="mistral/large")
    small = GateConfig.from_mapping({"routes": {OPENAI: {"tpm": 1_000}}})
    gates = RedisGates(
        admitter._client, small, prefix=admitter.gates.prefix if admitter.gates else ""
    )
    tight = RedisAdmitter(admitter._client, CONFIG, prefix=gates.prefix, gates=gates)
    with pytest.raises(SubmissionRefused, match="can never fit"):
        tight.submit("acme", "x", input_tokens=1_000, output_allowance=1, route=OPENAI)
    assert not admitter.is_queued("x")


def test_another_configuration_on_the_same_state_is_refused(
    redis_client: redis.Redis, key_prefix: str, make: Make
) -> None:
    make()
    other = CONFIG.model_copy(update={"quantum_tokens": 6_000})
    with pytest.raises(ConfigError, match="holds another configuration"):
        RedisAdmitter(redis_client, other, prefix=key_prefix)


# --- the admission transaction: a debit without its confirmation is released ----------------------

BUDGET = Budget(max_steps=20, max_tool_calls=20, max_tokens=100_000, deadline_s=1000)


def record_store(*ids: str) -> InProcessStore:
    store = InProcessStore()
    for tid in ids:
        store.create(new_record(BUDGET, tid=tid))
    return store


def admit_in_store(store: InProcessStore, tid: str) -> None:
    """The trajectory's compare-and-set admission: READY -> CALLING_MODEL, call registered."""
    rec = store.load("acme", tid)
    result = step(rec, Admit(now=1.0), KernelContext(make_agent(budget=BUDGET).profile))
    assert result.record.state is LifecycleState.CALLING_MODEL
    store.compare_and_set(result.record, rec.record_version, result.rows)


def test_a_claim_whose_dispatcher_died_before_confirming_it_is_requeued_and_refunded(
    make: Make, clock: ManualClock
) -> None:
    admitter = make(claim_ttl_s=5.0)
    assert admitter.gates is not None
    store = record_store("t1", "t2")
    for tid in ("t1", "t2"):
        admitter.submit("acme", tid, input_tokens=2_000, output_allowance=500, route=OPENAI)
    before = admitter.figures().tenant("acme").credit
    claim = claimed(admitter)  # ... and the dispatcher dies here, before the compare-and-set
    assert admitter.gates.reading(OPENAI).requests == 1
    ready = store_readiness(store)
    clock.advance(4.9)
    assert admitter.reconcile(ready).requeued == ()  # within its deadline: left alone
    clock.advance(0.1)
    assert admitter.reconcile(ready).requeued == ("t1",)
    reading = admitter.gates.reading(OPENAI)
    assert (reading.requests, reading.tokens, reading.leases) == (0, 0, 0)
    assert admitter.figures().tenant("acme").credit == before
    with pytest.raises(ClaimLapsed):
        admitter.confirm(claim)
    again = claimed(admitter)
    assert again.call.trajectory_id == "t1"  # back at the head of its queue


def test_a_claim_whose_record_was_admitted_but_never_confirmed_is_dropped(
    make: Make, clock: ManualClock
) -> None:
    admitter = make(claim_ttl_s=5.0)
    assert admitter.gates is not None
    store = record_store("t1")
    admitter.submit("acme", "t1", input_tokens=2_000, output_allowance=500, route=OPENAI)
    claim = claimed(admitter)
    admit_in_store(store, "t1")  # the compare-and-set landed; the claim's commit did not
    clock.advance(5.0)
    assert admitter.reconcile(store_readiness(store)).dropped == ("t1",)
    assert not admitter.is_queued("t1")  # not READY in the store: not queued again
    assert admitter.gates.reading(OPENAI).requests == 0
    with pytest.raises(ClaimLapsed):
        admitter.confirm(claim)  # the send is fenced: debit again before it may leave
    debit = admitter.gates.debit(OPENAI, claim.claim_id, claim.call.charge)
    assert debit.ok and debit.requests == 1


def test_a_confirmed_claim_keeps_its_debit_through_reconciliation(
    make: Make, clock: ManualClock
) -> None:
    admitter = make(claim_ttl_s=5.0)
    assert admitter.gates is not None
    store = record_store("t1")
    admitter.submit("acme", "t1", input_tokens=2_000, output_allowance=500, route=OPENAI)
    claim = claimed(admitter)
    admit_in_store(store, "t1")
    admitter.confirm(claim)
    clock.advance(5.0)
    assert admitter.gates.renew(OPENAI, claim.claim_id)
    assert admitter.reconcile(store_readiness(store)) == admitter.reconcile(store_readiness(store))
    reading = admitter.gates.reading(OPENAI)
    assert (reading.requests, reading.tokens, reading.leases) == (1, 2_500, 1)


def test_a_confirmation_guarded_by_a_commit_runs_only_if_that_commit_applied(
    make: Make, redis_client: redis.Redis, key_prefix: str
) -> None:
    admitter = make()
    admitter.submit("acme", "t1", input_tokens=2_000, output_allowance=500, route=OPENAI)
    claim = claimed(admitter)
    snap, admissions = f"{key_prefix}:guard:snap", f"{key_prefix}:guard:admissions"
    redis_client.rpush(admissions, "e0", "e1")
    mark = CommitMark(snap, "c2", "commit-a")
    figures = AdmissionRecord(admissions, '{"t": "acme"}', 2)
    command, finish = admitter.confirm_committed(claim, mark, figures)

    def send() -> Any:  # as behind a commit: in a batch, an error reply in its place
        batch = redis_client.pipeline(transaction=False)
        batch.execute_command(*command)
        return batch.execute(raise_on_error=False)[0]

    before = admitter.admitted()
    redis_client.hset(snap, "c2", "commit-b")  # another writer's commit won that version
    redis_client.script_flush()  # the first is answered NOSCRIPT: loaded and run again
    assert finish(send()) == (False, None)
    assert admitter.admitted() == before, "nothing counted for an admission that lost"
    assert redis_client.lrange(admissions, 0, -1) == [b"e0", b"e1"]
    assert redis_client.hget(f"{{{key_prefix}:adm}}:claims", claim.claim_id) is not None
    redis_client.hset(snap, "c2", "commit-a")  # this admission's commit applied
    ran, wait = finish(send())
    assert ran and wait is not None and wait >= 0
    assert admitter.admitted() != before, "the admission counted once its commit applied"
    assert redis_client.lrange(admissions, 0, -1) == [b"e1", b'{"t": "acme"}'], "capped at 2"
    with pytest.raises(StaleNomination):
        admitter.decline(claim)  # confirmed: no longer pending
    assert finish(send()) == (True, None), "a repeat: lapsed"


def test_in_memory_admitter_with_memory_gates_keeps_gated_calls_ready(clock: ManualClock) -> None:
    gates = MemoryGates(GATES, clock)
    admitter = Admitter(CONFIG, clock)
    for k in range(3):
        admitter.submit("acme", f"a{k}", input_tokens=2_000, output_allowance=500, route=OPENAI)
    assert admitter.admit_next(gates.check) is not None
    assert admitter.admit_next(gates.check) is not None
    assert admitter.admit_next(gates.check) is None  # concurrency 2
    assert admitter.is_queued("a2")
    lease = gates.lease_of("a1")
    assert lease is not None and gates.settle(OPENAI, lease, 2_000).leases == 1
    admitted = admitter.admit_next(gates.check)
    assert admitted is not None and admitted.trajectory_id == "a2"


def test_a_batch_of_claims_is_the_same_as_claims_one_after_another(
    make: Make, clock: ManualClock
) -> None:
    admitter = make()
    reference = Admitter(CONFIG, clock)
    for a in (admitter, reference):
        for k in range(6):
            for tenant in ("acme", "globex"):
                a.submit(tenant, f"{tenant}-{k}", input_tokens=1_000 * (1 + k), output_allowance=1)
    expected = []
    for _ in range(7):
        nomination = reference.nominate()
        assert nomination is not None
        reference.confirm(nomination)
        expected.append(nomination.call.trajectory_id)
    batch = admitter.claim_many(7)
    assert [c.call.trajectory_id for c in batch.claims] == expected
    assert len({c.claim_id for c in batch.claims}) == 7
    credits = [t.credit for t in admitter.figures().tenants]
    assert credits == [t.credit for t in reference.figures().tenants]
    assert admitter.withdraw(expected[2])  # one claim is dropped before its confirmation
    waits = admitter.confirm_many(batch.claims)
    assert [w is None for w in waits] == [False, False, True, False, False, False, False]
    answers = admitter.requeue_many(
        [
            ("acme", expected[0], 100, 1, None, None),
            ("acme", "acme-5", 100, 1, None, None),  # still queued
            ("globex", "huge", 10_000, 1, None, None),  # larger than globex's largest call
        ]
    )
    assert [type(a).__name__ for a in answers] == ["ReadyCall", "SubmissionRefused", "FinalizeNow"]


def test_a_route_refused_in_admit_next_is_closed_for_the_tenants_behind(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    three = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 5_000,
            "credit_cap_tokens": 20_000,
            "tenants": [
                {"name": n, "weight": 1, "max_ready": 5, "largest_call_tokens": 5_000}
                for n in ("a", "b", "c")
            ],
        }
    )
    gates = RedisGates(redis_client, GATES, prefix=key_prefix, clock=clock)
    shared = RedisAdmitter(redis_client, three, prefix=key_prefix, clock=clock, gates=gates)
    assert shared.gates is not None
    shared.gates.configure()
    memory = Admitter(three, clock)
    for a in (memory, shared):
        a.submit("a", "a0", input_tokens=2_000, output_allowance=500, route=OPENAI)
        a.submit("b", "b0", input_tokens=2_000, output_allowance=500, route=OPENAI)
        a.submit("c", "c0", input_tokens=2_000, output_allowance=500, route=ANTHROPIC)
    checked: dict[int, list[str]] = {id(memory): [], id(shared): []}
    for a in (memory, shared):
        log = checked[id(a)]

        def refuse_a(call: ReadyCall, log: list[str] = log) -> bool:
            log.append(call.trajectory_id)
            return call.tenant != "a"

        admitted = a.admit_next(refuse_a)
        assert admitted is not None and admitted.trajectory_id == "c0"
    # a's refusal closed OPENAI: b, behind it on that route, was not even asked
    assert checked[id(memory)] == checked[id(shared)] == ["a0", "c0"]


def test_a_call_declined_after_a_later_claim_emptied_its_lane_is_admitted_again(
    make: Make,
) -> None:
    """Two claims of one lane are outstanding; the later one takes its last call, so the lane
    leaves the rotation; then the earlier one is declined (its compare-and-set lost). The call
    must be nominable again: a lane with queued calls is always in the rotation."""
    admitter = make()
    for n in range(2):
        admitter.submit("acme", f"a{n}", input_tokens=2_000, output_allowance=500)
    first, second = admitter.nominate(), admitter.nominate()
    assert first is not None and second is not None
    assert {first.call.trajectory_id, second.call.trajectory_id} == {"a0", "a1"}
    admitter.confirm(second)  # the lane is empty now
    admitter.decline(first)
    again = admitter.nominate()
    assert again is not None and again.call.trajectory_id == first.call.trajectory_id


def test_a_lapsed_claim_requeued_after_its_lane_emptied_is_admitted_again(
    make: Make, clock: ManualClock
) -> None:
    admitter = make(claim_ttl_s=5.0)
    for n in range(3):
        admitter.submit("globex", f"g{n}", input_tokens=2_000, output_allowance=500)
    lost = admitter.nominate()  # its dispatcher dies
    assert lost is not None
    others = [admitter.nominate(), admitter.nominate()]
    for claim in others:
        assert claim is not None
        admitter.confirm(claim)
    clock.advance(6.0)
    done = admitter.reconcile(lambda tenant, tid: True)
    assert done.requeued == (lost.call.trajectory_id,)
    again = admitter.nominate()
    assert again is not None and again.call.trajectory_id == lost.call.trajectory_id


def test_a_long_skip_list_is_walked_past_page_by_page_as_in_process(
    redis_client: redis.Redis, key_prefix: str, clock: ManualClock
) -> None:
    """More lanes skipped than pick.lua reads in one page: the claim lands on the first lane
    not skipped, as drr.nominate's does on the same arrivals, in the new list and then old."""
    tenants = [
        {"name": f"t{i:02d}", "weight": 1, "max_ready": 5, "largest_call_tokens": 1_000}
        for i in range(80)
    ]
    config = AdmissionConfig.from_mapping(
        {"quantum_tokens": 1_000, "credit_cap_tokens": 2_000, "tenants": tenants}
    )
    shared = RedisAdmitter(redis_client, config, prefix=key_prefix, clock=clock)
    local = Admitter(config, clock)
    for admitter in (shared, local):
        for i in range(80):
            admitter.submit(f"t{i:02d}", f"t{i:02d}-a", input_tokens=900, output_allowance=100)
            admitter.submit(f"t{i:02d}", f"t{i:02d}-b", input_tokens=900, output_allowance=100)
    for skipped in (70, 40, 0):
        skip = list(range(skipped))
        claim = shared.claim(skip=skip).claim
        nomination = drr.nominate(local.state, set(skip), ())
        assert claim is not None and nomination is not None
        assert claim.call.trajectory_id == nomination.call.trajectory_id
        shared.confirm(claim)
        local.confirm(nomination)
