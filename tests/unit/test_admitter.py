"""The admitter: seed 004's numbers run through the scheduler, refusals, nominations, figures."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from decimal import Decimal
from itertools import count
from typing import Any

import pytest

from kernel.budget import Budget
from kernel.errors import ConfigError, StaleNomination, SubmissionRefused, UnknownTenant
from kernel.states import StopReason
from router.admission.fairness import jain_index
from router.admission.local import Admitter
from router.admission.queue import FinalizeNow
from router.admission.tenants import AdmissionConfig
from tests.support import ManualClock

# (name, weight, input tokens, output allowance)
Tenant = tuple[str, float, int, int]


def config(tenants: Iterable[Tenant], quantum: int, cap: int, **extra: Any) -> AdmissionConfig:
    return AdmissionConfig.from_mapping(
        {
            "quantum_tokens": quantum,
            "credit_cap_tokens": cap,
            "tenants": [
                {"name": n, "weight": w, "max_ready": 100, "largest_call_tokens": i + o}
                for n, w, i, o in tenants
            ],
            **extra,
        }
    )


class Backlogged:
    """Every tenant stays backlogged at fixed call sizes; one scheduling round takes 2 s."""

    ROUND_S = 2.0

    def __init__(self, cfg: AdmissionConfig, tenants: Iterable[Tenant]) -> None:
        self.admitter = Admitter(cfg, lambda: self.ROUND_S * self.admitter.state.rounds)
        self.calls: dict[str, int] = {}
        self.charge: dict[str, int] = {}
        self.admitted_at: dict[str, list[float]] = {}
        for name, _, i, o in tenants:
            self.calls[name], self.charge[name], self.admitted_at[name] = 0, 0, []
            for k in range(3):  # several trajectories per tenant: credit is per tenant
                self.admitter.submit(name, f"{name}-{k}", input_tokens=i, output_allowance=o)

    def run(self, rounds: int) -> None:
        admitter = self.admitter
        while admitter.state.rounds < rounds:
            nomination = admitter.nominate()
            assert nomination is not None
            admitter.confirm(nomination)
            call = nomination.call
            self.calls[call.tenant] += 1
            self.charge[call.tenant] += call.charge
            self.admitted_at[call.tenant].append(admitter.state.rounds * self.ROUND_S)
            requeued = admitter.requeue(
                call.tenant,
                call.trajectory_id,
                input_tokens=call.input_tokens,
                output_allowance=call.output_allowance,
            )
            assert not isinstance(requeued, FinalizeNow)

    def share(self, name: str) -> float:
        return self.charge[name] / sum(self.charge.values())

    def per_round(self, name: str) -> float:
        return self.calls[name] / self.admitter.state.rounds


# --- seed 004, Napkin Math 10.1 -------------------------------------------------------------

NAPKIN: list[Tenant] = [("interactive", 3, 2_000, 500), ("maintenance", 1, 40_000, 2_000)]


def test_napkin_math_10_1_through_the_scheduler() -> None:
    # cap = largest call + its quantum, so carried credit is never clipped
    sim = Backlogged(config(NAPKIN, quantum=8_000, cap=50_000), NAPKIN)
    sim.run(1_050)  # 1,050 rounds = 200 maintenance calls at 5.25 rounds each
    assert sim.per_round("interactive") == pytest.approx(24_000 / 2_500, abs=0.01)  # 9.6
    assert sim.admitter.state.rounds / sim.calls["maintenance"] == pytest.approx(5.25, abs=0.03)
    assert sim.share("interactive") == pytest.approx(0.75, abs=0.001)
    assert sim.calls["interactive"] / sim.calls["maintenance"] == pytest.approx(50.4, abs=0.5)


# --- seed 004, exercise "Three classes under deficit round-robin" ---------------------------

SUPPORT, REPAIR = ("support", 4, 3_000, 500), ("repair", 2, 30_000, 4_000)
THREE: list[Tenant] = [SUPPORT, REPAIR, ("maintenance", 1, 60_000, 4_000)]


def test_three_classes_shares_and_call_rates() -> None:
    sim = Backlogged(config(THREE, quantum=10_000, cap=80_000), THREE)
    sim.run(1_280)  # 200 maintenance calls at 6.4 rounds each
    assert sim.share("support") == pytest.approx(4 / 7, abs=0.001)  # 57.1 %
    assert sim.share("repair") == pytest.approx(2 / 7, abs=0.001)  # 28.6 %
    assert sim.share("maintenance") == pytest.approx(1 / 7, abs=0.001)  # 14.3 %
    assert sim.per_round("support") == pytest.approx(11.43, abs=0.01)
    assert sim.per_round("repair") == pytest.approx(0.588, abs=0.002)
    assert sim.per_round("maintenance") == pytest.approx(0.156, abs=0.001)
    times = sim.admitted_at["maintenance"]
    mean_interval_s = (times[-1] - times[0]) / (len(times) - 1)
    assert mean_interval_s / Backlogged.ROUND_S == pytest.approx(6.4, abs=0.05)
    assert mean_interval_s == pytest.approx(12.8, abs=0.1)


def test_three_classes_credit_cap_of_50000_is_refused_naming_maintenance() -> None:
    with pytest.raises(ConfigError) as info:
        config(THREE, quantum=10_000, cap=50_000)
    assert "'maintenance' (64,000)" in str(info.value)
    assert "repair" not in str(info.value)  # 34,000 fits under the cap


def test_three_classes_forced_cap_of_50000_never_runs_maintenance() -> None:
    # model_copy(update=...) skips validation: this is how one forces the refused cap
    forced = config(THREE, quantum=10_000, cap=80_000).model_copy(
        update={"credit_cap_tokens": 50_000}
    )
    sim = Backlogged(forced, THREE)
    sim.run(1_000)
    assert sim.calls["maintenance"] == 0
    assert sim.calls["support"] > 0 and sim.calls["repair"] > 0
    figures = sim.admitter.figures().tenant("maintenance")
    assert figures.credit == 50_000  # stuck at the cap, 14,000 short of its call
    assert figures.queue_depth == 3


def test_three_classes_weight_3_for_maintenance_cuts_support() -> None:
    tenants = [SUPPORT, REPAIR, ("maintenance", 3, 60_000, 4_000)]
    sim = Backlogged(config(tenants, quantum=10_000, cap=100_000), tenants)
    sim.run(1_280)
    assert 1 / sim.per_round("maintenance") == pytest.approx(2.13, abs=0.01)
    assert sim.share("support") == pytest.approx(4 / 9, abs=0.001)  # 44.4 %


def test_three_classes_compacting_maintenance_keeps_support() -> None:
    tenants = [SUPPORT, REPAIR, ("maintenance", 1, 20_000, 4_000)]
    sim = Backlogged(config(tenants, quantum=10_000, cap=80_000), tenants)
    sim.run(1_200)
    assert 1 / sim.per_round("maintenance") == pytest.approx(2.4, abs=0.01)
    assert sim.share("support") == pytest.approx(4 / 7, abs=0.001)  # still 57.1 %


def test_three_classes_as_service_classes_of_one_tenant() -> None:
    cfg = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 10_000,
            "credit_cap_tokens": 80_000,
            "tenants": [
                {
                    "name": "shop",
                    "weight": 1,
                    "max_ready": 100,
                    "largest_call_tokens": 64_000,
                    "classes": [{"name": n, "weight": w} for n, w, _, _ in THREE],
                }
            ],
        }
    )
    admitter = Admitter(cfg, lambda: 0.0)
    sizes = {n: (i, o) for n, _, i, o in THREE}
    for name, (i, o) in sizes.items():
        for k in range(3):
            admitter.submit(
                "shop", f"{name}-{k}", input_tokens=i, output_allowance=o, service_class=name
            )
    charge = dict.fromkeys(sizes, 0)
    for _ in range(20_000):
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
    total = sum(charge.values())
    for name, weight, _, _ in THREE:
        assert charge[name] / total == pytest.approx(weight / 7, abs=0.002)


# --- DRR beside a naive round-robin by call count -------------------------------------------


def naive_round_robin(tenants: list[Tenant], admissions: int) -> dict[str, int]:
    """Rotate over tenants, admitting ``weight`` calls each turn whatever their size."""
    charge = {n: 0 for n, *_ in tenants}
    turns = deque(tenants)
    admitted = 0
    while admitted < admissions:
        name, weight, i, o = turns[0]
        for _ in range(int(weight)):
            charge[name] += i + o
            admitted += 1
        turns.rotate(-1)
    return charge


def test_drr_holds_weight_shares_where_naive_round_robin_does_not() -> None:
    tenants: list[Tenant] = [("chat", 2, 2_000, 500), ("batch", 1, 40_000, 2_000)]
    sim = Backlogged(config(tenants, quantum=8_000, cap=60_000), tenants)
    sim.run(2_000)
    naive = naive_round_robin(tenants, sum(sim.calls.values()))
    naive_chat = naive["chat"] / sum(naive.values())
    assert sim.share("chat") == pytest.approx(2 / 3, abs=0.005)
    # naive: 2 x 2,500 against 42,000 per turn, about 10.6 % for the weight-2 tenant
    assert naive_chat == pytest.approx(5_000 / 47_000, abs=0.005)
    assert abs(naive_chat - 2 / 3) > 0.5


# --- submission: refused with a clear error, nothing enqueued -------------------------------

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


@pytest.fixture
def admitter() -> Admitter:
    return Admitter(AdmissionConfig.from_mapping(LIMITED), lambda: 0.0)


def queued(admitter: Admitter) -> list[int]:
    return [lane.queued for lane in admitter.state.lanes]


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
    ],
)
def test_bad_submissions_are_refused_and_change_nothing(
    admitter: Admitter, tenant: str, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"input_tokens": 1_000, "output_allowance": 500, **kwargs}
    with pytest.raises(error, match=match):
        admitter.submit(tenant, "t-1", **args)
    assert queued(admitter) == [0, 0]
    assert not admitter.is_queued("t-1")
    assert admitter.nominate() is None


def test_budget_within_maxima_and_full_queue(admitter: Admitter) -> None:
    budget = Budget(max_steps=10, max_cost=Decimal("1.00"))
    admitter.submit("acme", "t-1", input_tokens=1, output_allowance=1, budget=budget)
    with pytest.raises(SubmissionRefused, match="already queued"):
        admitter.submit("acme", "t-1", input_tokens=1, output_allowance=1)
    admitter.submit("acme", "t-2", input_tokens=1, output_allowance=1, service_class="batch")
    with pytest.raises(SubmissionRefused, match="max_ready 2"):
        admitter.submit("acme", "t-3", input_tokens=1, output_allowance=1)
    # a running trajectory coming back to READY is not refused for a full queue
    assert not isinstance(
        admitter.requeue("acme", "t-3", input_tokens=1, output_allowance=1), FinalizeNow
    )
    assert queued(admitter) == [3, 0]


def test_requeue_of_an_oversized_call_finalizes_with_max_tokens(admitter: Admitter) -> None:
    answer = admitter.requeue("globex", "t-9", input_tokens=5_000, output_allowance=1)
    assert isinstance(answer, FinalizeNow)
    assert answer.stop_reason is StopReason.MAX_TOKENS
    assert answer.stop_reason.value == "max_tokens"
    assert "5,001" in answer.why and "5,000" in answer.why
    assert queued(admitter) == [0, 0] and not admitter.is_queued("t-9")
    with pytest.raises(UnknownTenant):
        admitter.requeue("initech", "t-9", input_tokens=1, output_allowance=1)


# --- nomination, confirm, decline ------------------------------------------------------------


def two_backlogged(quantum: int = 5_000) -> Admitter:
    tenants: list[Tenant] = [("a", 1, 2_000, 500), ("b", 1, 2_000, 500)]
    admitter = Admitter(config(tenants, quantum=quantum, cap=20_000), lambda: 0.0)
    for name in ("a", "b"):
        for k in range(4):
            admitter.submit(name, f"{name}{k}", input_tokens=2_000, output_allowance=500)
    return admitter


def test_decline_keeps_credit_and_head_and_lets_the_other_tenant_go_first() -> None:
    admitter = two_backlogged()
    first = admitter.nominate()
    assert first is not None and first.call.trajectory_id == "a0"
    repeat = admitter.nominate()  # nominating again, with nothing resolved, names the same call
    assert repeat is not None and repeat.call is first.call
    credits = [lane.credit for lane in admitter.state.lanes]
    admitter.decline(first)
    assert [lane.credit for lane in admitter.state.lanes] == credits
    assert admitter.state.lanes[0].classes[0].queue[0] is first.call
    other = admitter.nominate()
    assert other is not None and other.call.trajectory_id == "b0"
    admitter.confirm(other)
    again = admitter.nominate()
    while again is not None and again.call.tenant == "b":
        admitter.confirm(again)
        again = admitter.nominate()
    assert again is not None and again.call is first.call


def test_stale_nominations_are_refused_and_change_nothing() -> None:
    admitter = two_backlogged()
    nomination = admitter.nominate()
    assert nomination is not None
    assert admitter.withdraw(nomination.call.trajectory_id)
    assert not admitter.withdraw(nomination.call.trajectory_id)
    credits = [lane.credit for lane in admitter.state.lanes]
    with pytest.raises(StaleNomination):
        admitter.confirm(nomination)
    with pytest.raises(StaleNomination):
        admitter.decline(nomination)
    assert [lane.credit for lane in admitter.state.lanes] == credits
    assert queued(admitter) == [3, 4]


def test_an_emptied_tenant_has_its_credit_reset() -> None:
    admitter = two_backlogged()
    for k in range(1, 4):
        admitter.withdraw(f"a{k}")
    nomination = admitter.nominate()
    assert nomination is not None and nomination.call.trajectory_id == "a0"
    admitter.confirm(nomination)
    assert admitter.state.lanes[0].queued == 0
    assert admitter.state.lanes[0].credit == 0


def test_admit_next_declines_when_the_check_refuses() -> None:
    admitter = two_backlogged()
    assert admitter.admit_next(lambda call: False) is None
    assert queued(admitter) == [4, 4]
    admitted = admitter.admit_next(lambda call: call.tenant == "b")
    assert admitted is not None and admitted.trajectory_id == "b0"
    assert queued(admitter) == [4, 3]


def test_a_quiet_tenant_goes_before_a_loud_one_mid_visit_but_only_once_per_round() -> None:
    tenants: list[Tenant] = [("quiet", 1, 2_000, 500), ("loud", 1, 2_000, 500)]
    admitter = Admitter(config(tenants, quantum=10_000, cap=20_000), lambda: 0.0)
    ids = count()
    for _ in range(20):
        admitter.submit("loud", f"l{next(ids)}", input_tokens=2_000, output_allowance=500)
    order = []

    def admit() -> str:
        nomination = admitter.nominate()
        assert nomination is not None
        admitter.confirm(nomination)
        order.append(nomination.call.tenant)
        return nomination.call.tenant

    for _ in range(5):  # four calls on its newcomer visit, then one into its first old visit
        assert admit() == "loud"
    # loud's visit still has 7,500 credit: three more calls before its turn ends
    admitter.submit("quiet", "q1", input_tokens=2_000, output_allowance=500)
    assert admit() == "quiet"  # a newcomer does not wait for loud's visit to end
    admitter.submit("quiet", "q2", input_tokens=2_000, output_allowance=500)
    # quiet just had its newcomer turn this round: now it waits its turn behind loud's visit
    assert [admit() for _ in range(4)] == ["loud", "loud", "loud", "quiet"]


# --- fairness figures ------------------------------------------------------------------------


def test_figures_count_waits_charge_and_jain_in_the_window() -> None:
    now = ManualClock()
    tenants: list[Tenant] = [("a", 1, 2_000, 500), ("b", 1, 2_000, 500)]
    cfg = config(tenants, quantum=2_500, cap=20_000, fairness_window_s=10.0)  # 1 call a visit
    admitter = Admitter(cfg, now)
    for k in range(3):
        admitter.submit("a", f"a{k}", input_tokens=2_000, output_allowance=500)
        admitter.submit("b", f"b{k}", input_tokens=2_000, output_allowance=500)
    now.set(3.0)
    for _ in range(2):
        nomination = admitter.nominate()
        assert nomination is not None
        assert admitter.confirm(nomination) == 3.0
    figures = admitter.figures()
    assert figures.jain_index == pytest.approx(1.0)
    a = figures.tenant("a")
    assert (a.admitted_calls, a.admitted_charge, a.queue_depth) == (1, 2_500, 2)
    assert a.credit == admitter.state.lanes[0].credit
    assert dict(a.wait_buckets)[2.5] == 0 and dict(a.wait_buckets)[5.0] == 1
    assert a.wait_buckets[-1] == (float("inf"), 1)
    assert a.wait_sum_s == 3.0
    now.set(30.0)  # both earlier admissions leave the window; b is admitted, a still waits
    nomination = admitter.nominate()
    while nomination is not None and nomination.call.tenant != "b":
        admitter.decline(nomination)
        nomination = admitter.nominate()
    assert nomination is not None
    admitter.confirm(nomination)
    assert admitter.figures().jain_index == pytest.approx(0.5)


def test_jain_index() -> None:
    assert jain_index([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain_index([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([]) is None and jain_index([0.0]) is None


def test_turns_running_before_the_admitter_was_built_count_against_the_cap() -> None:
    """A router that takes the local admitter over counts the acting trajectories it finds in
    the store (``router.process.chores.rebuild_queues``), so the cap holds across the handover."""
    cfg = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 1_000,
            "credit_cap_tokens": 4_000,
            "tenants": [
                {"name": "acme", "weight": 1, "max_ready": 9, "largest_call_tokens": 1_000}
                | {"max_in_flight": 2},
                {"name": "globex", "weight": 1, "max_ready": 9, "largest_call_tokens": 1_000},
            ],
        }
    )
    admitter = Admitter(cfg, lambda: 0.0)
    admitter.running("acme", "old-1")
    admitter.running("acme", "old-2")
    admitter.running("initech", "x")  # a tenant this version does not know: nothing to count
    admitter.submit("acme", "a", input_tokens=100, output_allowance=100)
    admitter.submit("globex", "g", input_tokens=100, output_allowance=100)
    nomination = admitter.nominate()
    assert nomination is not None and nomination.call.trajectory_id == "g"
    admitter.confirm(nomination)
    assert admitter.nominate() is None and admitter.in_flight("acme") == 2
    assert admitter.release("acme", "old-1")
    nomination = admitter.nominate()
    assert nomination is not None and nomination.call.trajectory_id == "a"
