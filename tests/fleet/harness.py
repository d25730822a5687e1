"""An in-process fleet for fast tests: a router service and a turn runner, without Celery.

The router's sender only collects turn messages; :meth:`InProcessFleet.run_until_quiet` hands
them to the turn runner in this thread, so every path of the dispatch loop and of a turn runs
against the real Redis (store, admitter, feed) with nothing asynchronous left to wait for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import redis

from examples.support_store.backend import SupportStoreBackend
from examples.support_store.state import RedisState
from kernel.agent import AgentModule
from kernel.authority import AuthorityLookup
from kernel.record import TrajectoryRecord
from kernel.settings import Settings
from kernel.tools import ToolBackend
from router.admission.gates import GateConfig
from router.admission.redis.gates import RedisGates
from router.fleet.agents import AgentCache
from router.fleet.observe import RouterObserver
from router.placement.membership import Membership
from router.process.service import AdmitterKind, RouterOptions, RouterService
from router.wire.custody import Custody
from router.wire.turns import TurnMessage
from store.memory_base import MemoryBank
from tests.conftest import REDIS_URL
from worker.fleet_agents import ModelOverrides, TurnTools
from worker.follow_on import FollowOn
from worker.leases import LeaseKeeper
from worker.tool_gates import ToolGates
from worker.turn import TurnObserver, TurnReport, TurnRunner

AGENT = "examples.support_store:agent_lookup"
ORDER_TOTAL = 4200


def seed_orders(
    client: redis.Redis, prefix: str, first: int, count: int, total: int = ORDER_TOTAL
) -> list[str]:
    """Orders ``ord_<first>`` ... of customer cu_ana in the shared support-store state."""
    ids = [f"ord_{n}" for n in range(first, first + count)]
    order = {"customer": "cu_ana", "total": total, "refunded": 0, "status": "delivered"}
    pipe = client.pipeline(transaction=False)
    for oid in ids:
        pipe.set(f"{prefix}:store:order:{oid}", json.dumps(order))
    pipe.execute()
    return ids


def refund_job(order_id: str, agent: str = AGENT) -> dict[str, Any]:
    """The job body of one refund (the tenant is not in it)."""
    return {
        "agent": agent,
        "goal": f"refund the damaged item on order {order_id}",
        "user": "cu_ana",
    }


class Submits(Protocol):
    """What :func:`submit_refunds` needs: a router API's submission."""

    def submit(self, tenant: str, body: dict[str, Any]) -> Any: ...


def submit_refunds(api: Submits, orders: list[str], tenants: list[str]) -> list[tuple[str, str]]:
    """A refund job per order, the tenants taking turns (so every backlog grows alike);
    the (tenant, trajectory id) of each, in order."""
    ids = []
    for i, oid in enumerate(orders):
        tenant = tenants[i % len(tenants)]
        ids.append((tenant, api.submit(tenant, refund_job(oid)).trajectory_id))
    return ids


class _Observer(RouterObserver, TurnObserver):
    """What watches the router and the worker of one process
    (``ops.observability.metrics.Metrics``)."""


class InProcessFleet:
    """A router and one worker's turn runner in this process (see the module docstring);
    ``observer`` (metrics) watches both."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        tenants_file: Path,
        *,
        admitter: str = "redis",
        gates_file: str = "",
        observer: _Observer | None = None,
        follow_on_turns: int | None = None,
        leases: LeaseKeeper | None = None,
        backend: Callable[[RedisState], ToolBackend] = SupportStoreBackend,
        memory: MemoryBank | None = None,
        tool_gates: ToolGates | None = None,
        authority: AuthorityLookup | None = None,
    ) -> None:
        self.client, self.prefix = client, prefix
        env = {
            "REINS_KEY_PREFIX": prefix,
            "REINS_REDIS_URL": REDIS_URL,
            "REINS_TENANTS_FILE": str(tenants_file),
        }
        if follow_on_turns is not None:
            env["REINS_FOLLOW_ON_TURNS"] = str(follow_on_turns)
        self.settings = Settings.from_env(env)
        self.sent: list[tuple[str, dict[str, Any]]] = []
        options = RouterOptions(
            name="r1",
            tenants_file=str(tenants_file),
            gates_file=gates_file,
            admitter=AdmitterKind(admitter),
        )
        self.service = RouterService(
            self.settings,
            options,
            client=client,
            sender=lambda m, p: self.sent.append((m, p)),
            observer=observer,
        )
        Membership(client, prefix).register("w1")
        # The tenants' grants and freezes (the fleet's document), for the router's steps too.
        self.service.agents.authority = authority
        self.service.tick()
        self.store = self.service.store
        self.feed = self.service.feed
        self.api = self.service.api()
        self.state = RedisState(client, prefix, seed=False)
        self.backend = backend(self.state)
        tools = TurnTools(
            AgentCache(authority=authority),
            {},
            ModelOverrides(scripted_latency_s=0.0),
            self._backend,
            memory,
        )
        self.draining = False
        self.custody = Custody(client, prefix)
        self.follow_on = None
        if follow_on_turns is not None:  # follow-on turns (worker.follow_on), as in a fleet
            self.follow_on = FollowOn.configured(
                self.settings,
                worker="w1",
                client=client,
                store=self.store,
                gates=RedisGates(client, GateConfig(routes={}), prefix=prefix),
                custody=self.custody,
                feed=self.feed,
                draining=lambda: self.draining,
                observer=observer,
            )
            assert self.follow_on is not None
        self.runner = TurnRunner(
            store=self.store,
            tools=tools,
            feed=self.feed,
            worker="w1",
            observer=observer,
            custody=self.custody if self.follow_on is not None else None,
            follow_on=self.follow_on,
            leases=leases,
            tool_gates=tool_gates,
        )
        self.reports: list[TurnReport] = []

    def _backend(self, agent: AgentModule, ref: str) -> ToolBackend:
        return self.backend

    def cycle(self) -> bool:
        """One router cycle (intake and admission); True if it did anything."""
        return self.service.cycle()

    def take(self) -> list[TurnMessage]:
        """The turn messages the router sent since the last call."""
        out = [TurnMessage.from_payload(p) for _, p in self.sent]
        self.sent.clear()
        return out

    def run_until_quiet(self, limit: int = 100_000) -> int:
        """Admit and run turns until nothing is left to do; returns the turns run."""
        turns = 0
        while turns < limit:
            busy = self.cycle()
            messages = self.take()
            for msg in messages:
                self.reports.append(self.runner.run(msg))
                turns += 1
            if not busy and not messages:
                return turns
        raise AssertionError(f"not quiet after {limit} turns")

    def load(self, tenant: str, trajectory_id: str) -> TrajectoryRecord:
        return self.store.load(tenant, trajectory_id)
