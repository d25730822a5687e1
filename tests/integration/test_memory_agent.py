"""The remembering support-store agent on the embedded runner with the SQLite memory: a
preference noted in one run is used in the next run of the same customer, and of no other."""

from __future__ import annotations

from pathlib import Path

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.remembering import RememberingPolicy, agent
from kernel.budget import Budget
from kernel.context import KernelContext
from kernel.memory import MemoryKind
from kernel.record import TrajectoryRecord
from kernel.states import StopReason
from store.memory_sqlite import SqliteMemory
from tests.support.clock import ManualClock
from worker.embedded import EmbeddedRunner
from worker.memory_tools import MemoryBackend
from worker.models import ScriptedModel

CLOCK = ManualClock(1_800_000_000.0)


def run(memory: SqliteMemory, backend: SupportStoreBackend, goal: str, user: str, tid: str):  # type: ignore[no-untyped-def]
    ref = "examples.support_store.remembering:agent"
    runner = EmbeddedRunner(
        KernelContext(agent.profile),
        ScriptedModel(RememberingPolicy.from_goal(goal)),
        MemoryBackend(backend, memory, "acme", ref, CLOCK),
    )
    rec = TrajectoryRecord.create(
        trajectory_id=tid,
        tenant="acme",
        user=user,
        goal=goal,
        agent=ref,
        budget=Budget(),
        now=0.0,
    )
    return runner.run(rec).record


def test_a_noted_preference_is_used_in_the_customers_next_run_only(tmp_path: Path) -> None:
    memory = SqliteMemory(tmp_path / "memory.db")
    backend = SupportStoreBackend()
    said = "refund the damaged item on order ord_1001; the customer prefers replies in ar"
    first = run(memory, backend, said, "cu_ana", "t1")
    assert first.stop_reason is StopReason.DONE
    [fact] = memory.items("acme", MemoryKind.FACT)
    assert (fact.scope.value, fact.subject, fact.value) == ("user", "cu_ana", {"text": "ar"})
    second = run(memory, backend, "refund the damaged item on order ord_1004", "cu_ana", "t2")
    assert second.stop_reason is StopReason.DONE
    emails = [e for e in backend.effects() if e[0] == "email"]
    assert emails == [["email", "ord_1001", "ar"], ["email", "ord_1004", "ar"]]
