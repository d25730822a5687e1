"""A memory store that does not answer is a fault like any other: the memory tool's outcome is
unknown (a write, re-sent under its key) or an error (a read), and the worker's turn goes on;
an episode that cannot be written is dropped, logged, and never fails the turn."""

from __future__ import annotations

from collections.abc import Iterable

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.remembering import agent
from kernel.budget import Budget
from kernel.context import StepResult
from kernel.errors import StoreUnavailable
from kernel.events import DispatchTool, Finish
from kernel.memory import MemoryItem, MemoryKind, Visibility
from kernel.record import TrajectoryRecord
from kernel.states import LifecycleState, StopReason
from router.fleet.agents import AgentCache
from router.fleet.episodes import Episodes, write_episode
from store.memory_base import DictMemory
from worker.fleet_agents import TurnTools
from worker.providers.base import InFlightCalls
from worker.turn_commands import CommandCarrier

AGENT = "examples.support_store.remembering:agent"


class Unanswering(DictMemory):
    """The dict bank's contract, with the server gone: every call raises StoreUnavailable."""

    def put(self, item: MemoryItem) -> None:
        raise StoreUnavailable("memory: Redis unreachable after 5 attempts")

    def _ranked(
        self, vis: Visibility, kind: MemoryKind, wanted: tuple[str, ...], now_ms: int, limit: int
    ) -> list[MemoryItem]:
        raise StoreUnavailable("memory: Redis unreachable after 5 attempts")

    def _tenant_items(self, tenant: str) -> Iterable[MemoryItem]:
        raise StoreUnavailable("memory: Redis unreachable after 5 attempts")


def record() -> TrajectoryRecord:
    return TrajectoryRecord.create(
        trajectory_id="t1",
        tenant="acme",
        user="cu_ana",
        goal="refund ord_1001",
        agent=AGENT,
        budget=Budget(),
        now=0.0,
    )


def command(tool: str, args: dict[str, object]) -> DispatchTool:
    return DispatchTool(
        call_id="t1/c1",
        attempt_id="t1/c1/a1",
        tool=tool,
        args=args,
        idempotency_key="k1",
        timeout_s=5.0,
        fence=2,
    )


def test_a_memory_store_that_does_not_answer_gives_unknown_or_error_not_a_crash() -> None:
    tools = TurnTools(
        AgentCache(), {}, backend_factory=lambda a, r: SupportStoreBackend(), memory=Unanswering()
    )
    carrier = CommandCarrier(tools, InFlightCalls(), None, lambda: 1_800_000_000.0)
    rec = record()
    wrote = carrier.call_tool(
        rec, command("remember_fact", {"key": "k", "value": "ar", "tags": ["lang"]})
    )
    assert wrote.result == {"status": "unknown", "code": "backend_error"}
    read = carrier.call_tool(rec, command("recall_facts", {"tags": ["lang"]}))
    assert read.result == {"status": "error", "code": "backend_error"}
    # the agent's own tools are untouched by the memory store's fault
    order = carrier.call_tool(rec, command("get_order", {"order_id": "ord_1001"}))
    assert order.result["status"] == "ok"


def test_an_episode_the_store_refuses_is_dropped_and_reported() -> None:
    ended = record()
    ended.stop_reason = StopReason.DONE
    assert write_episode(Unanswering(), ended, agent.profile, 1_800_000_000.0) is False
    bank = DictMemory()
    assert write_episode(bank, ended, agent.profile, 1_800_000_000.0) is True
    [episode] = bank.items("acme", MemoryKind.EPISODE)
    assert (episode.subject, episode.value["outcome"]) == ("cu_ana", "done")


def test_each_recall_reports_a_hit_or_a_miss_for_the_tenant() -> None:
    bank = DictMemory()
    seen: list[tuple[str, bool]] = []
    tools = TurnTools(
        AgentCache(), {}, backend_factory=lambda a, r: SupportStoreBackend(), memory=bank
    )
    carrier = CommandCarrier(
        tools,
        InFlightCalls(),
        None,
        lambda: 1_800_000_000.0,
        on_recall=lambda t, h: seen.append((t, h)),
    )
    rec = record()
    carrier.call_tool(rec, command("recall_facts", {"tags": ["lang"]}))
    carrier.call_tool(rec, command("remember_fact", {"key": "k", "value": "ar", "tags": ["lang"]}))
    carrier.call_tool(rec, command("recall_facts", {"tags": ["lang"]}))
    assert seen == [("acme", False), ("acme", True)]


def test_an_ending_whose_agent_cannot_be_loaded_costs_the_episode_not_the_commit() -> None:
    ended = record()
    ended.stop_reason = StopReason.CANCELED
    ended.closing_message = "The request was canceled."
    result = StepResult(
        ended,
        [Finish(state=LifecycleState.CANCELED, stop=StopReason.CANCELED, message="canceled")],
    )
    bank = DictMemory()
    episodes = Episodes(bank, lambda: 1_800_000_000.0)
    assert episodes.after_loading(result, AgentCache(allowed=lambda ref: False)) is False
    assert bank.items("acme") == []
    assert episodes.after_loading(result, AgentCache()) is True
    assert episodes.after_loading(StepResult(ended, []), AgentCache()) is False  # not an end
    [episode] = bank.items("acme", MemoryKind.EPISODE)
    assert episode.value["lesson"] == "The request was canceled."
