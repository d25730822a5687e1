"""``RedisAdmitter.claim_returning``: the worker's requeue-and-claim of a follow-on turn.

A call with a gate is claimed only when weighted deficit round-robin picks it next, so a
follow-on admission never overtakes anyone for scarce quota: the property below holds it to a
twin admitter that takes the router's path (requeue, then a claim that expects the call) from
the same history.
A call with no gate is claimed at once, with the same books as any claim.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.admission.claims import ReturningCall
from router.admission.gates import GateSettlement
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from tests.quota.test_redis_admitter import CONFIG, GATES, OPENAI
from tests.support import ManualClock

pytestmark = pytest.mark.redis
Build = Callable[[], RedisAdmitter]


def builder(client: redis.Redis, prefix: str, clock: ManualClock) -> Build:
    def build() -> RedisAdmitter:
        p = f"{prefix}-{uuid.uuid4().hex[:8]}"  # each admitter its own state
        gates = RedisGates(client, GATES, prefix=p, clock=clock)
        gates.configure()
        return RedisAdmitter(client, CONFIG, prefix=p, clock=clock, gates=gates)

    return build


@pytest.fixture
def build(redis_client: redis.Redis, key_prefix: str, clock: ManualClock) -> Build:
    return builder(redis_client, key_prefix, clock)


def drain(admitter: RedisAdmitter) -> list[str]:
    """Claim and confirm until nothing passes; the trajectory ids in order."""
    order = []
    while (claim := admitter.nominate()) is not None:
        admitter.confirm(claim)
        assert admitter.gates is not None
        if claim.call.route:
            admitter.gates.settle(claim.call.route, claim.claim_id, None)
        order.append(claim.call.trajectory_id)
    return order


def depths(admitter: RedisAdmitter) -> list[int]:
    return [t.queue_depth for t in admitter.figures().tenants]


calls = st.lists(
    st.tuples(
        st.sampled_from(["acme", "globex"]),
        st.integers(500, 8_000),  # input tokens (output allowance 500): charges up to 8.5k
        st.sampled_from([OPENAI, ""]),
    ),
    max_size=8,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    history=calls,
    claims=st.integers(0, 4),
    tenant=st.sampled_from(["acme", "globex"]),
    tokens=st.integers(500, 8_000),
)
def test_a_gated_call_is_claimed_exactly_when_the_router_would_claim_it_next(
    redis_client: redis.Redis,
    key_prefix: str,
    history: list[tuple[str, int, str]],
    claims: int,
    tenant: str,
    tokens: int,
) -> None:
    clock = ManualClock(1_000.0)
    build = builder(redis_client, key_prefix, clock)
    returning, routed = build(), build()
    for admitter in (returning, routed):  # one history for both
        for n, (who, size, route) in enumerate(history):
            admitter.submit(who, f"{who}-{n}", input_tokens=size, output_allowance=500, route=route)
        for _ in range(claims):
            claim = admitter.nominate()
            if claim is not None:
                admitter.confirm(claim)
    entry = ReturningCall(tenant, "back", tokens, 500, None, OPENAI)
    queued, claim = returning.claim_returning(entry)
    routed.requeue(tenant, "back", input_tokens=tokens, output_allowance=500, route=OPENAI)
    expected = routed.claim(depths=True, expect="back").claim
    assert queued
    assert (claim is None) == (expected is None)
    if claim is not None and expected is not None:
        assert claim.call.trajectory_id == expected.call.trajectory_id == "back"
        assert claim.call.charge == expected.call.charge
        assert claim.depths == expected.depths
        returning.confirm(claim)
        routed.confirm(expected)
    assert drain(returning) == drain(routed), "the same admissions follow, in the same order"
    assert returning.admitted() == routed.admitted()


def test_a_call_with_no_gate_is_claimed_at_once_past_queued_calls(build: Build) -> None:
    admitter = build()
    for n in range(3):
        admitter.submit("acme", f"a-{n}", input_tokens=2_000, output_allowance=500)
        admitter.submit("globex", f"g-{n}", input_tokens=2_000, output_allowance=500)
    before = depths(admitter)
    queued, claim = admitter.claim_returning(ReturningCall("acme", "back", 2_000, 500, None, None))
    assert queued and claim is not None
    assert claim.call.trajectory_id == "back" and claim.call.charge == 2_500
    assert depths(admitter) == before, "nothing else left its queue"
    admitter.confirm(claim)
    assert admitter.admitted()[0] == (1, 2_500), "counted as any admission"
    assert sorted(drain(admitter)) == sorted(
        [f"a-{n}" for n in range(3)] + [f"g-{n}" for n in range(3)]
    )


def test_a_call_already_queued_changes_nothing_but_the_settlement(build: Build) -> None:
    admitter = build()
    assert admitter.gates is not None
    admitter.submit("acme", "first", input_tokens=2_000, output_allowance=500, route=OPENAI)
    held = admitter.nominate()
    assert held is not None and held.gate is not None and held.gate.leases == 1
    admitter.confirm(held)
    admitter.submit("acme", "back", input_tokens=2_000, output_allowance=500, route=OPENAI)
    before = depths(admitter)
    answer = admitter.claim_returning(
        ReturningCall("acme", "back", 2_000, 500, None, OPENAI),
        settle=GateSettlement(OPENAI, held.claim_id, 1_000),
    )
    assert answer == (False, None)
    assert depths(admitter) == before
    reading = admitter.gates.reading(OPENAI)
    assert reading.leases == 0, "the ended turn's lease was settled"
    assert reading.tokens == 1_000, "with the tokens it used"


def test_the_settled_slot_is_the_one_the_next_turn_takes(build: Build) -> None:
    admitter = build()
    assert admitter.gates is not None
    for n in range(2):  # concurrency 2 on OPENAI: both slots held
        admitter.submit("acme", f"run-{n}", input_tokens=2_000, output_allowance=500, route=OPENAI)
    running = [admitter.nominate(), admitter.nominate()]
    for claim in running:
        assert claim is not None
        admitter.confirm(claim)
    assert (
        admitter.claim_returning(ReturningCall("globex", "other", 2_000, 500, None, OPENAI))[1]
        is None
    )
    ended = running[0]
    assert ended is not None
    queued, claim = admitter.claim_returning(
        ReturningCall("acme", "run-0", 2_000, 500, None, OPENAI),
        settle=GateSettlement(OPENAI, ended.claim_id, 2_000),
    )
    assert queued
    if claim is None:  # DRR picked globex's call first: the slot is a router's to give it
        nxt = admitter.nominate()
        assert nxt is not None and nxt.call.trajectory_id == "other"
    assert admitter.gates.reading(OPENAI).leases == 2, "one slot freed, one taken"
