"""Every ending leaves an episode: a run the worker ends, and runs the router ends (at admission,
by a stop the admitter decided, by a cancel or a kill between turns). Each episode is filed under
the run's user (the default), says how the run stopped, and its lesson is the closing message
the kernel built from the state."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from examples.support_store.notes import NotesBackend
from kernel.memory import MemoryKind, Scope
from kernel.states import StopReason
from store.memory_redis import RedisMemory
from tests.fleet.conftest import tenants_toml
from tests.fleet.harness import InProcessFleet, seed_orders

pytestmark = pytest.mark.redis
AGENT = "examples.support_store.notes:agent"


@pytest.fixture
def fleet(redis_client: redis.Redis, key_prefix: str, tmp_path: Path) -> InProcessFleet:
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(tenants_toml())
    memory = RedisMemory(redis_client, prefix=key_prefix)
    return InProcessFleet(redis_client, key_prefix, tenants, backend=NotesBackend, memory=memory)


def submit(fleet: InProcessFleet, user: str, order: str, **extra: object) -> str:
    job = {"agent": AGENT, "goal": f"refund the damaged item on order {order}", "user": user}
    return fleet.api.submit("acme", {**job, **extra}).trajectory_id


def test_runs_ended_by_a_worker_or_by_a_router_each_leave_their_episode(
    fleet: InProcessFleet, redis_client: redis.Redis, key_prefix: str
) -> None:
    orders = seed_orders(redis_client, key_prefix, 800, 5)
    done = submit(fleet, "cu_ana", orders[0])  # the worker's turn ends it
    at_admission = submit(fleet, "cu_ana", orders[1], budget={"max_steps": 0})
    canceled = submit(fleet, "cu_ana", orders[2])
    killed = submit(fleet, "cu_ana", orders[3])
    finalized = submit(fleet, "cu_ana", orders[4])
    fleet.api.control("acme", canceled, "cancel", "ops")  # READY: the router API ends it
    fleet.api.control("acme", killed, "kill", "ops")
    fleet.service.dispatcher.finalize("acme", finalized, StopReason.MAX_TOKENS, "call too large")
    fleet.run_until_quiet()

    memory = RedisMemory(redis_client, prefix=key_prefix)
    episodes = {e.key: e for e in memory.items("acme", MemoryKind.EPISODE)}
    expected = {
        done: StopReason.DONE,
        at_admission: StopReason.MAX_STEPS,
        canceled: StopReason.CANCELED,
        killed: StopReason.KILLED,
        finalized: StopReason.MAX_TOKENS,
    }
    assert set(episodes) == set(expected), "a run's ending left no episode"
    for tid, stop in expected.items():
        rec, episode = fleet.load("acme", tid), episodes[tid]
        assert rec.stop_reason is stop
        assert (episode.scope, episode.subject) == (Scope.USER, "cu_ana")  # per user, the default
        assert episode.value["outcome"] == stop.value
        assert episode.value["lesson"] == rec.closing_message and rec.closing_message
        assert episode.concerns == ("cu_ana",) and episode.trajectory_id == tid
