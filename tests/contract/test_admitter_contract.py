"""The admitter contract (router/admission/queue.py): every test runs on memory, on the real Redis
and on a real three-master Redis Cluster (where a script touching two slots fails with CROSSSLOT).

The last test drives both implementations in lockstep through random operations and asserts
they admit the same calls and hold the same credits and depths after every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from kernel.budget import Budget
from kernel.errors import StaleNomination, SubmissionRefused, UnknownTenant
from kernel.states import StopReason
from router.admission.gates import GateConfig
from router.admission.local import Admitter
from router.admission.queue import AdmissionQueue, FinalizeNow
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig

REDIS_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("cluster", marks=pytest.mark.redis),
]
BACKENDS = ["memory", *REDIS_KINDS]
Make = Callable[[AdmissionConfig], AdmissionQueue]
Tenant = tuple[str, float, int, int]  # name, weight, input tokens, output allowance


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest) -> Iterator[Make]:
    if request.param == "memory":
        yield lambda cfg: Admitter(cfg, lambda: 0.0)
        return
    client, prefix = _redis_of(request, request.param)
    serial = itertools.count()
    yield lambda cfg: RedisAdmitter(
        client, cfg, prefix=f"{prefix}-{next(serial)}", clock=lambda: 0.0
    )
    if request.param == "cluster":
        assert_one_slot_each(client, prefix, serial)


def assert_one_slot_each(client: redis.Redis, prefix: str, serial: Iterator[int]) -> None:
    """Every key the admitters left is in its admitter's one slot: Redis refuses a script's key
    of another slot only when another master holds it, so the keys written are checked too."""
    for n in range(next(serial)):
        tag = f"{{{prefix}-{n}:adm}}"
        keys = [*client.scan_iter(match=f"{prefix}-{n}:*"), *client.scan_iter(match=f"{tag}*")]
        assert {key_slot(k) for k in keys} <= {key_slot(tag.encode())}, keys


def _redis_of(request: pytest.FixtureRequest, kind: str) -> tuple[redis.Redis, str]:
    """The client and a key prefix of the test's own, on the single Redis or the cluster."""
    if kind == "cluster":
        return request.getfixturevalue("redis_cluster"), request.getfixturevalue(
            "cluster_key_prefix"
        )
    return request.getfixturevalue("redis_client"), request.getfixturevalue("key_prefix")


@pytest.fixture(params=REDIS_KINDS)
def shared_redis(request: pytest.FixtureRequest) -> tuple[redis.Redis, str]:
    """The single Redis or the cluster, with a key prefix of the test's own."""
    return _redis_of(request, request.param)


def config(
    tenants: Iterable[Tenant],
    quantum: int,
    cap: int,
    tenant_extra: dict[str, int] | None = None,
    **extra: Any,
) -> AdmissionConfig:
    """``tenant_extra``: a ``max_in_flight`` per tenant name."""
    caps = tenant_extra or {}
    return AdmissionConfig.from_mapping(
        {
            "quantum_tokens": quantum,
            "credit_cap_tokens": cap,
            "tenants": [
                {"name": n, "weight": w, "max_ready": 100, "largest_call_tokens": i + o}
                | ({"max_in_flight": caps[n]} if n in caps else {})
                for n, w, i, o in tenants
            ],
            **extra,
        }
    )


def credits(admitter: AdmissionQueue) -> list[int]:
    return [t.credit for t in admitter.figures().tenants]


def depths(admitter: AdmissionQueue) -> list[int]:
    return [t.queue_depth for t in admitter.figures().tenants]


def admit(admitter: AdmissionQueue) -> str:
    nomination = admitter.nominate()
    assert nomination is not None
    admitter.confirm(nomination)
    return nomination.call.trajectory_id


# --- shares ---------------------------------------------------------------------------------


def test_backlogged_tenants_share_the_charge_by_weight(make: Make) -> None:
    tenants: list[Tenant] = [("interactive", 3, 2_000, 500), ("maintenance", 1, 40_000, 2_000)]
    admitter = make(config(tenants, quantum=8_000, cap=50_000))
    for name, _, i, o in tenants:
        for k in range(3):
            admitter.submit(name, f"{name}-{k}", input_tokens=i, output_allowance=o)
    charge = {"interactive": 0, "maintenance": 0}
    for _ in range(3_000):  # 58 maintenance calls (napkin math 10.1: one per 50.4 interactive)
        nomination = admitter.nominate()
        assert nomination is not None
        admitter.confirm(nomination)
        call = nomination.call
        charge[call.tenant] += call.charge
        admitter.requeue(
            call.tenant,
            call.trajectory_id,
            input_tokens=call.input_tokens,
            output_allowance=call.output_allowance,
        )
    assert charge["interactive"] / sum(charge.values()) == pytest.approx(0.75, abs=0.01)


# --- submission -----------------------------------------------------------------------------

LIMITED: dict[str, Any] = {
    "quantum_tokens": 1_000,
    "credit_cap_tokens": 10_000,
    "tenants": [
        {
            "name": "acme",
            "weight": 1,
            "max_ready": 2,
            "largest_call_tokens": 5_000,
            "budget_max": {"steps": 10, "dollars": "1.00"},
            "classes": [{"name": "chat", "weight": 1}, {"name": "batch", "weight": 1}],
        },
        {"name": "globex", "weight": 1, "max_ready": 5, "largest_call_tokens": 5_000},
    ],
}


@pytest.mark.parametrize(
    ("tenant", "kwargs", "error", "match"),
    [
        ("initech", {}, UnknownTenant, "'initech' is not configured; known: acme, globex"),
        ("acme", {"service_class": "bulk"}, SubmissionRefused, "no service class 'bulk'"),
        ("acme", {"input_tokens": 4_600}, SubmissionRefused, r"5,100 tokens .* largest call"),
        ("acme", {"input_tokens": -1}, SubmissionRefused, "input_tokens must be an integer"),
        ("acme", {"output_allowance": True}, SubmissionRefused, "output_allowance"),
        ("acme", {"budget": Budget(max_steps=11)}, SubmissionRefused, "steps 11 exceeds"),
        ("acme", {"budget": Budget(max_cost=Decimal("1.01"))}, SubmissionRefused, "dollars"),
        ("acme", {"route": "bad route"}, SubmissionRefused, "route 'bad route' must match"),
    ],
)
def test_bad_submissions_are_refused_and_change_nothing(
    make: Make, tenant: str, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    admitter = make(AdmissionConfig.from_mapping(LIMITED))
    args: dict[str, Any] = {"input_tokens": 1_000, "output_allowance": 500, **kwargs}
    with pytest.raises(error, match=match):
        admitter.submit(tenant, "t-1", **args)
    assert depths(admitter) == [0, 0]
    assert not admitter.is_queued("t-1")
    assert admitter.nominate() is None


def test_duplicates_full_queues_and_returning_trajectories(make: Make) -> None:
    admitter = make(AdmissionConfig.from_mapping(LIMITED))
    budget = Budget(max_steps=10, max_cost=Decimal("1.00"))
    admitter.submit("acme", "t-1", input_tokens=1, output_allowance=1, budget=budget)
    with pytest.raises(SubmissionRefused, match="already queued"):
        admitter.submit("acme", "t-1", input_tokens=1, output_allowance=1)
    admitter.submit("acme", "t-2", input_tokens=1, output_allowance=1, service_class="batch")
    with pytest.raises(SubmissionRefused, match="max_ready 2"):
        admitter.submit("acme", "t-3", input_tokens=1, output_allowance=1)
    returned = admitter.requeue("acme", "t-3", input_tokens=1, output_allowance=1)
    assert not isinstance(returned, FinalizeNow) and returned.ready_at == 0.0
    assert depths(admitter) == [3, 0]
    assert all(admitter.is_queued(t) for t in ("t-1", "t-2", "t-3"))


def test_requeue_of_an_oversized_call_finalizes_with_max_tokens(make: Make) -> None:
    admitter = make(AdmissionConfig.from_mapping(LIMITED))
    answer = admitter.requeue("globex", "t-9", input_tokens=5_000, output_allowance=1)
    assert isinstance(answer, FinalizeNow) and answer.stop_reason is StopReason.MAX_TOKENS
    assert depths(admitter) == [0, 0] and not admitter.is_queued("t-9")


# --- nomination, confirm, decline ------------------------------------------------------------


def two_backlogged(make: Make) -> AdmissionQueue:
    tenants: list[Tenant] = [("a", 1, 2_000, 500), ("b", 1, 2_000, 500)]
    admitter = make(config(tenants, quantum=5_000, cap=20_000))
    for name in ("a", "b"):
        for k in range(4):
            admitter.submit(name, f"{name}{k}", input_tokens=2_000, output_allowance=500)
    return admitter


def test_decline_keeps_credit_and_head_and_lets_the_other_tenant_go_first(make: Make) -> None:
    admitter = two_backlogged(make)
    before = credits(admitter)
    first = admitter.nominate()
    assert first is not None and first.call.trajectory_id == "a0"
    admitter.decline(first)
    assert credits(admitter) == before and depths(admitter) == [4, 4]
    assert admitter.is_queued("a0")
    assert admit(admitter) == "b0"
    order = [admit(admitter) for _ in range(2)]
    assert order == ["b1", "a0"]  # b's visit ends when its credit does; a0 is still a's head


def test_resolving_a_withdrawn_nomination_is_refused_and_changes_nothing(make: Make) -> None:
    admitter = two_backlogged(make)
    before = credits(admitter)
    nomination = admitter.nominate()
    assert nomination is not None
    assert admitter.withdraw(nomination.call.trajectory_id)
    assert not admitter.withdraw(nomination.call.trajectory_id)
    assert not admitter.is_queued(nomination.call.trajectory_id)
    with pytest.raises(StaleNomination):
        admitter.confirm(nomination)
    with pytest.raises(StaleNomination):
        admitter.decline(nomination)
    assert credits(admitter) == before and depths(admitter) == [3, 4]


def test_an_emptied_tenant_has_its_credit_reset(make: Make) -> None:
    admitter = two_backlogged(make)
    for k in range(1, 4):
        assert admitter.withdraw(f"a{k}")
    assert admit(admitter) == "a0"
    assert depths(admitter)[0] == 0 and credits(admitter)[0] == 0


def test_admit_next_declines_when_the_check_refuses(make: Make) -> None:
    admitter = two_backlogged(make)
    assert admitter.admit_next(lambda call: False) is None
    assert depths(admitter) == [4, 4]
    admitted = admitter.admit_next(lambda call: call.tenant == "b")
    assert admitted is not None and admitted.trajectory_id == "b0"
    assert depths(admitter) == [4, 3] and not admitter.is_queued("b0")


def test_a_quiet_tenant_goes_before_a_loud_one_mid_visit_but_once_per_round(make: Make) -> None:
    tenants: list[Tenant] = [("quiet", 1, 2_000, 500), ("loud", 1, 2_000, 500)]
    admitter = make(config(tenants, quantum=10_000, cap=20_000))
    for k in range(20):
        admitter.submit("loud", f"l{k}", input_tokens=2_000, output_allowance=500)
    assert [admit(admitter) for _ in range(5)] == ["l0", "l1", "l2", "l3", "l4"]
    admitter.submit("quiet", "q1", input_tokens=2_000, output_allowance=500)
    assert admit(admitter) == "q1"
    admitter.submit("quiet", "q2", input_tokens=2_000, output_allowance=500)
    assert [admit(admitter) for _ in range(4)] == ["l5", "l6", "l7", "q2"]


def test_service_classes_share_their_tenant_by_weight(make: Make) -> None:
    classes = [("chat", 3, 3_000, 500), ("batch", 1, 30_000, 4_000)]
    cfg = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 10_000,
            "credit_cap_tokens": 50_000,
            "tenants": [
                {
                    "name": "shop",
                    "weight": 1,
                    "max_ready": 100,
                    "largest_call_tokens": 34_000,
                    "classes": [{"name": n, "weight": w} for n, w, _, _ in classes],
                }
            ],
        }
    )
    admitter = make(cfg)
    for name, _, i, o in classes:
        for k in range(2):
            admitter.submit(
                "shop", f"{name}{k}", input_tokens=i, output_allowance=o, service_class=name
            )
    charge = {"chat": 0, "batch": 0}
    for _ in range(1_500):
        nomination = admitter.nominate()
        assert nomination is not None
        admitter.confirm(nomination)
        call = nomination.call
        charge[call.service_class] += call.charge
        admitter.requeue(
            "shop",
            call.trajectory_id,
            input_tokens=call.input_tokens,
            output_allowance=call.output_allowance,
            service_class=call.service_class,
        )
    assert charge["chat"] / sum(charge.values()) == pytest.approx(0.75, abs=0.02)


# --- per-tenant caps (max_in_flight, docs/adr/0123-tenant-caps.md) ---------------------------

CAPPED: list[Tenant] = [("capped", 4, 2_000, 500), ("b", 3, 2_000, 500), ("c", 1, 2_000, 500)]
CAP_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "admit", "admit", "end", "end", "decline", "gated", "withdraw"]),
        st.integers(0, 2),  # tenant (submit) or which tenants a gated check passes
        st.integers(0, 63),  # which turn in flight ends, or which queued call is withdrawn
    ),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=CAP_OPS, cap=st.integers(1, 3))
def test_a_capped_tenant_never_has_more_turns_in_flight_than_its_cap(
    make: Make, ops: list[tuple[str, int, int]], cap: int
) -> None:
    """Whatever the interleaving of admissions, declines, gated admissions, withdrawals and
    ended turns (ended twice, too), a tenant never has more than ``cap`` turns admitted and not
    ended; the others are never held up by it."""
    admitter = make(config(CAPPED, quantum=5_000, cap=20_000, tenant_extra={"capped": cap}))
    serial = itertools.count()
    queued: dict[str, str] = {}  # trajectory -> tenant, waiting
    flying: list[tuple[str, str]] = []  # (tenant, trajectory), admitted and not ended, in order
    for name, _, _, _ in CAPPED:
        for _ in range(4):
            tid = f"{name}-{next(serial)}"
            admitter.submit(name, tid, input_tokens=2_000, output_allowance=500)
            queued[tid] = name
    for op, which, pick in ops:
        if op in ("admit", "gated", "decline"):
            if op == "gated":
                passing = {n for n, *_ in CAPPED[which:]}
                call = admitter.admit_next(lambda c, passing=passing: c.tenant in passing)
                admitted = None if call is None else call.trajectory_id
            else:
                nomination = admitter.nominate()
                admitted = None if nomination is None else nomination.call.trajectory_id
                if nomination is not None and op == "decline":
                    admitter.decline(nomination)
                    admitted = None
                elif nomination is not None:
                    admitter.confirm(nomination)
            if admitted is None:
                # nothing admitted: then every tenant with a call queued is capped or refused
                uncapped_waiting = set(queued.values()) - {"capped"}
                assert op != "admit" or not uncapped_waiting or nomination is not None
                continue
            tenant = queued.pop(admitted)
            flying.append((tenant, admitted))
        elif op == "end" and flying:
            tenant, tid = flying.pop(pick % len(flying))
            assert admitter.release(tenant, tid)
            assert not admitter.release(tenant, tid)  # ending twice credits once
            queued[tid] = tenant  # its next turn
            admitter.requeue(tenant, tid, input_tokens=2_000, output_allowance=500)
        elif op == "withdraw" and queued:
            tid = sorted(queued)[pick % len(queued)]
            assert admitter.withdraw(tid)
            del queued[tid]
        mine = sum(1 for t, _ in flying if t == "capped")
        assert mine <= cap
        assert admitter.in_flight("capped") == mine
        assert admitter.in_flight("b") == sum(1 for t, _ in flying if t == "b")


def test_uncapped_tenants_share_by_weight_while_one_waits_at_its_cap(make: Make) -> None:
    """The capped tenant (the heaviest weight) gets at most its cap in flight; the others share
    the rest 3:1 as weighted, and its credit does not grow while it waits."""
    admitter = make(config(CAPPED, quantum=5_000, cap=20_000, tenant_extra={"capped": 1}))
    for name, _, i, o in CAPPED:
        for k in range(12):  # more than can be in flight: every tenant stays backlogged
            admitter.submit(name, f"{name}{k}", input_tokens=i, output_allowance=o)
    flying: list[tuple[str, str]] = []
    charge = {"capped": 0, "b": 0, "c": 0}
    capped_credit: set[int] = set()
    for _ in range(2_000):
        nomination = admitter.nominate()
        assert nomination is not None  # the uncapped tenants are backlogged throughout
        admitter.confirm(nomination)
        call = nomination.call
        charge[call.tenant] += call.charge
        flying.append((call.tenant, call.trajectory_id))
        assert admitter.in_flight("capped") <= 1
        if admitter.in_flight("capped") == 1:
            capped_credit.add(credits(admitter)[0])
        if len(flying) > 8:  # turns end oldest first, eight in flight across tenants
            tenant, tid = flying.pop(0)
            assert admitter.release(tenant, tid)
            admitter.requeue(tenant, tid, input_tokens=2_000, output_allowance=500)
    assert charge["b"] / (charge["b"] + charge["c"]) == pytest.approx(0.75, abs=0.01)
    assert charge["capped"] / sum(charge.values()) < 4 / 8  # it would take half uncapped
    assert max(capped_credit) <= 20_000  # at most the credit cap, never a growing debt


# --- lockstep: the two implementations agree step by step -----------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "submit", "requeue", "withdraw", "confirm", "decline", "gated", "end"]
        ),
        st.integers(0, 2),  # tenant
        st.integers(0, 1),  # class
        st.integers(1, 12_000),  # charge
        st.integers(0, 40),  # which queued trajectory (withdraw); which tenants pass (gated)
    ),
    min_size=1,
    max_size=80,
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=OPS, quantum=st.sampled_from([1_000, 4_000]), weights=st.tuples(*[st.integers(1, 4)] * 3)
)
def test_memory_and_redis_admit_the_same_calls_step_by_step(
    shared_redis: tuple[redis.Redis, str],
    ops: list[tuple[str, int, int, int, int]],
    quantum: int,
    weights: tuple[int, int, int],
) -> None:
    document: dict[str, Any] = {
        "quantum_tokens": quantum,
        "credit_cap_tokens": 16_000,
        "tenants": [
            {"name": f"t{i}", "weight": w, "max_ready": 6, "largest_call_tokens": 12_000}
            for i, w in enumerate(weights)
        ],
    }
    document["tenants"][1]["classes"] = [
        {"name": "chat", "weight": 2},
        {"name": "batch", "weight": 1},
    ]
    document["tenants"][0]["max_in_flight"] = 2  # caps pass lanes over the same way in both
    document["tenants"][2]["max_in_flight"] = 1
    cfg = AdmissionConfig.from_mapping(document)
    memory = Admitter(cfg, lambda: 0.0)
    redis_client, key_prefix = shared_redis
    prefix = f"{key_prefix}-{next(_EXAMPLES)}"
    gates = RedisGates(redis_client, ROUTES, prefix=prefix)
    gates.configure()
    shared = RedisAdmitter(redis_client, cfg, prefix=prefix, clock=lambda: 0.0, gates=gates)
    queued: list[str] = []
    flying: list[str] = []
    tenant_of: dict[str, str] = {}
    for serial, (op, lane, klass, charge, pick) in enumerate(ops):
        if op == "end":  # a turn in flight ends (twice: the second changes nothing)
            if flying:
                tid = flying.pop(pick % len(flying))
                tenant = tenant_of[tid]
                for a in (memory, shared):
                    assert a.release(tenant, tid) and not a.release(tenant, tid)
        else:
            outcomes = [
                _apply(a, op, lane, klass, charge, pick, serial, queued) for a in (memory, shared)
            ]
            assert outcomes[0] == outcomes[1], (op, outcomes)
            if op in ("submit", "requeue") and outcomes[0] == "queued":
                queued.append(f"x{serial}")
                tenant_of[f"x{serial}"] = f"t{lane}"
            elif outcomes[0] not in (None, "refused", "finalize", "queued") and op != "decline":
                queued.remove(str(outcomes[0]))
                if op != "withdraw":
                    flying.append(str(outcomes[0]))
        assert credits(memory) == credits(shared) and depths(memory) == depths(shared)
        for t in ("t0", "t1", "t2"):
            assert memory.in_flight(t) == shared.in_flight(t)
        assert memory.in_flight("t0") <= 2 and memory.in_flight("t2") <= 1
    for key in redis_client.scan_iter(match=f"{{{prefix}:*", count=1000):
        redis_client.delete(key)


_EXAMPLES = itertools.count()
ROUTES = GateConfig.from_mapping({"routes": {"p/one": {}, "p/two": {}}})  # no limits


def _apply(
    admitter: AdmissionQueue,
    op: str,
    lane: int,
    klass: int,
    charge: int,
    pick: int,
    serial: int,
    queued: list[str],
) -> object:
    tenant = f"t{lane}"
    service_class = ("chat", "batch")[klass] if lane == 1 else None
    kwargs: dict[str, Any] = {
        "input_tokens": charge - 1,
        "output_allowance": 1,
        "service_class": service_class,
        "route": ("p/one", "p/two")[charge % 2],
    }
    if op == "submit":
        try:
            admitter.submit(tenant, f"x{serial}", **kwargs)
        except SubmissionRefused:
            return "refused"
        return "queued"
    if op == "requeue":
        answer = admitter.requeue(tenant, f"x{serial}", **kwargs)
        return "finalize" if isinstance(answer, FinalizeNow) else "queued"
    if op == "withdraw":
        if not queued:
            return None
        target = queued[pick % len(queued)]
        assert admitter.withdraw(target)
        return target
    if op == "gated":  # a check that refuses some tenants' calls, or one route's
        # refuse some tenants' calls (their routes then count as closed), or one route's
        admitted = admitter.admit_next(
            lambda call: (
                bool(pick >> int(call.tenant[1]) & 1)
                if pick < 24
                else call.route != ("p/one", "p/two")[pick % 2]
            )
        )
        return None if admitted is None else admitted.trajectory_id
    nomination = admitter.nominate()
    if nomination is None:
        return None
    if op == "decline":
        admitter.decline(nomination)
    else:
        admitter.confirm(nomination)
    return nomination.call.trajectory_id
