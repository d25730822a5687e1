"""A tool's gate lease around each call: held while the call runs, kept alive, settled after;
no lease for a tool without a gate; no call at all when no slot comes before the deadline."""

from __future__ import annotations

import pytest

from router.admission.gates import GateConfig, MemoryGates
from tests.support import ManualClock
from worker.leases import LeaseKeeper
from worker.tool_gates import NoCapacity, ToolGates, tool_route

ROUTE = tool_route("issue_refund")


def gates_of(clock: ManualClock) -> MemoryGates:
    config = GateConfig.from_mapping({"routes": {ROUTE: {"concurrency": 1, "lease_ttl_s": 3}}})
    return MemoryGates(config, clock)


def test_the_lease_is_held_and_kept_alive_for_the_call_and_settled_after() -> None:
    clock = ManualClock(100.0)
    gates = gates_of(clock)
    keeper = LeaseKeeper(gates, clock)
    tool = ToolGates(gates, keeper, lambda route: 3.0, clock=clock, pause=clock.advance)
    with tool.held("issue_refund", "a1", within_s=5):
        assert keeper.held() == ["a1"]
        clock.advance(2.5)
        assert keeper.renew_due() == 1, "renewed while the call runs"
        clock.advance(2.5)  # past the first ttl: the renewal kept the slot
        assert not gates.debit(ROUTE, "other", 0).ok
    assert keeper.held() == []
    assert gates.debit(ROUTE, "other", 0).ok, "settled: the slot is free again"


def test_no_slot_before_the_deadline_calls_nothing_and_holds_nothing() -> None:
    clock = ManualClock(100.0)
    gates = gates_of(clock)
    keeper = LeaseKeeper(gates, clock)
    tool = ToolGates(gates, keeper, lambda route: 3.0, clock=clock, pause=clock.advance)
    assert gates.debit(ROUTE, "busy", 0).ok
    keeper.hold(ROUTE, "busy", 3.0)
    ran = []
    with (
        pytest.raises(NoCapacity, match="tool/issue_refund"),
        tool.held("issue_refund", "a2", within_s=1.0),
    ):
        ran.append(1)
    assert ran == [] and keeper.held() == ["busy"]
    assert gates.reading(ROUTE).leases == 1


def test_a_tool_without_a_gate_runs_at_once_without_a_lease() -> None:
    clock = ManualClock(100.0)
    keeper = LeaseKeeper(gates_of(clock), clock)
    tool = ToolGates(gates_of(clock), keeper, lambda route: 3.0, clock=clock, pause=clock.advance)
    with tool.held("send_status_email", "a3", within_s=0):
        assert keeper.held() == []


class CountingGates(MemoryGates):
    """The in-memory gates, counting what the worker asks of them."""

    def __init__(self, config: GateConfig, clock: ManualClock) -> None:
        super().__init__(config, clock)
        self.asked = 0

    def debit(self, route: str, lease_id: str, tokens: int):  # type: ignore[no-untyped-def]
        self.asked += 1
        return super().debit(route, lease_id, tokens)


def test_a_tool_the_document_does_not_gate_asks_the_gates_nothing() -> None:
    """The worker reads from the fleet's document which tools are gated: a call of any other
    tool costs no round trip to the shared gates (the turn's hot path)."""
    clock = ManualClock(100.0)
    config = GateConfig.from_mapping({"routes": {ROUTE: {"concurrency": 1, "lease_ttl_s": 3}}})
    gates = CountingGates(config, clock)
    keeper = LeaseKeeper(gates, clock)
    declared = {ROUTE}
    tool = ToolGates(
        gates, keeper, lambda r: 3.0, gated=declared.__contains__, clock=clock, pause=clock.advance
    )
    with tool.held("send_status_email", "a4", within_s=0):
        assert keeper.held() == []
    assert gates.asked == 0
    with tool.held("issue_refund", "a5", within_s=1):
        assert keeper.held() == ["a5"]
    assert gates.asked == 1
