"""Properties of the admitter under random configurations and random operation sequences."""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kernel.errors import SubmissionRefused
from router.admission.drr import NEW, OLD, UNLISTED, DrrState
from router.admission.local import Admitter
from router.admission.queue import FinalizeNow
from router.admission.tenants import AdmissionConfig


@st.composite
def configurations(draw: st.DrawFn) -> dict[str, Any]:
    """2-4 tenants with integer weights, some with two service classes, and a valid cap."""
    quantum = draw(st.sampled_from([500, 1_000, 4_000]))
    tenants = []
    for n in range(draw(st.integers(2, 4))):
        tenant: dict[str, Any] = {
            "name": f"t{n}",
            "weight": draw(st.integers(1, 5)),
            "max_ready": draw(st.integers(1, 6)),
            "largest_call_tokens": draw(st.integers(500, 20_000)),
        }
        if draw(st.booleans()):
            tenant["classes"] = [
                {"name": "chat", "weight": draw(st.integers(1, 3))},
                {"name": "batch", "weight": draw(st.integers(1, 3))},
            ]
        tenants.append(tenant)
    largest = max(t["largest_call_tokens"] for t in tenants)
    cap = largest + draw(st.integers(0, 2 * quantum * 5))  # sometimes clips carried credit
    return {"quantum_tokens": quantum, "credit_cap_tokens": cap, "tenants": tenants}


def credits(state: DrrState) -> list[tuple[int, list[int]]]:
    return [(lane.credit, [c.credit for c in lane.classes]) for lane in state.lanes]


def queues(state: DrrState) -> list[list[list[str]]]:
    return [
        [[call.trajectory_id for call in c.queue] for c in lane.classes] for lane in state.lanes
    ]


class AdmitterMachine(RuleBasedStateMachine):
    """Drives one admitter and a plain model of its queues; checks the state after every step."""

    @initialize(document=configurations())
    def setup(self, document: dict[str, Any]) -> None:
        self.config = AdmissionConfig.from_mapping(document)
        self.now = 0.0
        self.admitter = Admitter(self.config, lambda: self.now)
        self.model: dict[tuple[int, int], deque[str]] = {
            (i, k): deque()
            for i, t in enumerate(self.config.tenants)
            for k in range(len(t.class_names))
        }
        self.serial = 0

    def _anything_queued(self) -> bool:
        return any(self.model.values())

    @rule(data=st.data(), oversize=st.booleans(), returning=st.booleans())
    def submit(self, data: st.DataObject, oversize: bool, returning: bool) -> None:
        lane = data.draw(st.integers(0, len(self.config.tenants) - 1))
        tenant = self.config.tenants[lane]
        klass = data.draw(st.integers(0, len(tenant.class_names) - 1))
        largest = tenant.largest_call_tokens
        charge = (
            largest + data.draw(st.integers(1, 1_000))
            if oversize
            else data.draw(st.integers(1, largest))
        )
        self.serial += 1
        trajectory = f"x{self.serial}"
        kwargs: dict[str, Any] = {
            "input_tokens": charge - 1,
            "output_allowance": 1,
            "service_class": tenant.class_names[klass],
        }
        before = (credits(self.admitter.state), queues(self.admitter.state))
        full = self.admitter.state.lanes[lane].queued >= tenant.max_ready
        if returning:
            answer = self.admitter.requeue(tenant.name, trajectory, **kwargs)
            if oversize:
                assert isinstance(answer, FinalizeNow)
                assert answer.stop_reason.value == "max_tokens"
                assert (credits(self.admitter.state), queues(self.admitter.state)) == before
                return
        elif oversize or full:
            try:
                self.admitter.submit(tenant.name, trajectory, **kwargs)
            except SubmissionRefused:
                assert (credits(self.admitter.state), queues(self.admitter.state)) == before
                return
            raise AssertionError("an oversized call or a full queue was accepted")
        else:
            self.admitter.submit(tenant.name, trajectory, **kwargs)
        self.model[(lane, klass)].append(trajectory)

    @precondition(lambda self: self._anything_queued())
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        candidates = [(key, t) for key, q in self.model.items() for t in q]
        key, trajectory = data.draw(st.sampled_from(candidates))
        assert self.admitter.withdraw(trajectory)
        self.model[key].remove(trajectory)

    @precondition(lambda self: self._anything_queued())
    @rule(wait=st.floats(0, 5))
    def admit(self, wait: float) -> None:
        state = self.admitter.state
        nomination = self.admitter.nominate()
        # a validated cap covers every permitted call, so a backlog always yields a nomination
        assert nomination is not None
        key = (nomination.lane, nomination.klass)
        assert self.model[key][0] == nomination.call.trajectory_id  # FIFO within a class
        lane = state.lanes[nomination.lane]
        before = lane.credit
        ready_at = nomination.call.ready_at
        self.now += wait
        assert self.admitter.confirm(nomination) == self.now - ready_at
        self.model[key].popleft()
        expected = 0 if lane.queued == 0 else before - nomination.call.charge
        assert lane.credit == expected

    @precondition(lambda self: self._anything_queued())
    @rule()
    def decline(self) -> None:
        nomination = self.admitter.nominate()
        assert nomination is not None
        state = self.admitter.state
        before = (credits(state), queues(state))
        self.admitter.decline(nomination)
        assert (credits(state), queues(state)) == before
        queue = state.lanes[nomination.lane].classes[nomination.klass].queue
        assert queue[0] is nomination.call

    @invariant()
    def credit_within_zero_and_cap(self) -> None:
        state = self.admitter.state
        for lane_credit, class_credits in credits(state):
            assert 0 <= lane_credit <= state.credit_cap
            assert all(0 <= c <= state.credit_cap for c in class_credits)

    @invariant()
    def an_empty_queue_holds_no_credit(self) -> None:
        for lane in self.admitter.state.lanes:
            if lane.queued == 0:
                assert lane.credit == 0
            for k, cls in enumerate(lane.classes):
                assert bool(cls.queue) == (k in lane.class_active) or len(lane.classes) == 1
                if not cls.queue:
                    assert cls.credit == 0

    @invariant()
    def rotation_is_consistent(self) -> None:
        state = self.admitter.state
        assert len(set(state.new)) == len(state.new) and len(set(state.old)) == len(state.old)
        for i, lane in enumerate(state.lanes):
            where = (i in state.new, i in state.old)
            assert where == (lane.listed == NEW, lane.listed == OLD)
            if lane.listed == NEW:
                assert lane.queued > 0  # only emptied lanes linger, and only in old
            if lane.queued:
                assert lane.listed != UNLISTED

    @invariant()
    def queues_match_the_model(self) -> None:
        state = self.admitter.state
        for (i, k), expected in self.model.items():
            assert queues(state)[i][k] == list(expected)
        assert [lane.queued for lane in state.lanes] == [
            sum(len(self.model[(i, k)]) for k in range(len(lane.classes)))
            for i, lane in enumerate(state.lanes)
        ]


AdmitterMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None
)
TestAdmitterMachine = AdmitterMachine.TestCase


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    weights=st.lists(st.integers(1, 5), min_size=2, max_size=4),
    sizes=st.data(),
    quantum=st.sampled_from([1_000, 2_500, 8_000]),
)
def test_backlogged_shares_stay_within_one_quantum_and_one_cap_of_their_weights(
    weights: list[int], sizes: st.DataObject, quantum: int
) -> None:
    """Shreedhar-Varghese bound: per unit weight, two backlogged tenants' admitted charge never
    differs by more than one base quantum plus one cap over the smaller weight, so shares
    converge to weights as admissions grow."""
    charges = [sizes.draw(st.integers(100, 40_000)) for _ in weights]
    cap = max(charges) + quantum * max(weights)  # no clipping of carried credit
    document = {
        "quantum_tokens": quantum,
        "credit_cap_tokens": cap,
        "tenants": [
            {"name": f"t{i}", "weight": w, "max_ready": 4, "largest_call_tokens": c}
            for i, (w, c) in enumerate(zip(weights, charges, strict=True))
        ],
    }
    admitter = Admitter(AdmissionConfig.from_mapping(document), lambda: 0.0)
    for i, c in enumerate(charges):
        for k in range(2):
            admitter.submit(f"t{i}", f"t{i}-{k}", input_tokens=c - 1, output_allowance=1)
    served = [0] * len(weights)
    bound = quantum + cap / min(weights)
    for _ in range(3_000):
        nomination = admitter.nominate()
        assert nomination is not None
        admitter.confirm(nomination)
        call = nomination.call
        served[nomination.lane] += call.charge
        admitter.requeue(
            call.tenant, call.trajectory_id, input_tokens=call.input_tokens, output_allowance=1
        )
        per_weight = [s / w for s, w in zip(served, weights, strict=True)]
        assert max(per_weight) - min(per_weight) <= bound


# --- the active lists against a scan of every lane ---------------------------------------------


class ScanDrr:
    """The policy of router/admission/drr.py for one-class tenants with no active lists: each lane
    holds a ticket taken when it joined the tail of its list, and the head of a list is found by
    scanning every lane for the smallest ticket. Slow (every pick reads every tenant) and obviously
    in order, so the deques can be held to it."""

    def __init__(self, quanta: list[int], cap: int) -> None:
        self.quanta, self.cap = quanta, cap
        self.credit = [0] * len(quanta)
        self.queue: list[deque[tuple[str, int]]] = [deque() for _ in quanta]
        self.listed = [UNLISTED] * len(quanta)
        self.ticket = [0] * len(quanta)
        self.tickets = 0

    def _to_tail(self, lane: int, listed: int) -> None:
        self.tickets += 1
        self.listed[lane], self.ticket[lane] = listed, self.tickets

    def _head(self, listed: int) -> int | None:
        lanes = [i for i, x in enumerate(self.listed) if x == listed]
        return min(lanes, key=lambda i: self.ticket[i]) if lanes else None

    def enqueue(self, lane: int, tid: str, charge: int) -> None:
        self.queue[lane].append((tid, charge))
        if len(self.queue[lane]) == 1:
            self.credit[lane] = min(self.quanta[lane], self.cap)
            if self.listed[lane] == UNLISTED:
                self._to_tail(lane, NEW)

    def admit(self) -> str | None:
        for _ in range(10_000):
            lane = self._head(NEW)
            lane = self._head(OLD) if lane is None else lane
            if lane is None:
                return None
            if not self.queue[lane]:
                self.listed[lane] = UNLISTED
                continue
            tid, charge = self.queue[lane][0]
            if charge <= self.credit[lane]:
                self.queue[lane].popleft()
                self.credit[lane] -= charge
                if not self.queue[lane]:
                    self._emptied(lane)
                return tid
            self.credit[lane] = min(self.credit[lane] + self.quanta[lane], self.cap)
            self._to_tail(lane, OLD)
        raise AssertionError("no call admitted in 10,000 visits")

    def _emptied(self, lane: int) -> None:
        self.credit[lane] = 0
        if self.listed[lane] == NEW:
            self._to_tail(lane, OLD)
        elif self._head(OLD) == lane:
            self.listed[lane] = UNLISTED


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=40)
    | st.lists(st.integers(1, 4), min_size=1, max_size=5),
    st.lists(st.tuples(st.booleans(), st.integers(0, 39), st.integers(100, 5_000)), max_size=300),
)
def test_the_active_lists_admit_in_the_order_a_scan_of_every_lane_does(
    weights: list[int], steps: list[tuple[bool, int, int]]
) -> None:
    """O(1) picks from the new and old lists, against the O(tenants) reference, on the same
    arrivals: the same calls admitted in the same order."""
    config = AdmissionConfig.from_mapping(
        {
            "quantum_tokens": 1_000,
            "credit_cap_tokens": 9_000,
            "tenants": [
                {"name": f"t{i}", "weight": w, "max_ready": 10**6, "largest_call_tokens": 5_000}
                for i, w in enumerate(weights)
            ],
        }
    )
    admitter = Admitter(config, lambda: 0.0)
    state = admitter.state
    scan = ScanDrr([lane.quantum for lane in state.lanes], state.credit_cap)
    for serial, (arrives, lane, charge) in enumerate(steps):
        if arrives:
            lane %= len(weights)
            tid = f"c{serial}"
            admitter.submit(f"t{lane}", tid, input_tokens=charge - 1, output_allowance=1)
            scan.enqueue(lane, tid, charge)
            continue
        nomination = admitter.nominate()
        expected = scan.admit()
        assert (nomination.call.trajectory_id if nomination else None) == expected
        if nomination is not None:
            admitter.confirm(nomination)
