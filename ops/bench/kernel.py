"""``reins bench kernel``: scenario A on the embedded runner against the same agent on LangGraph.

Both sides persist after every step and alternate round by round in one process; the figure is
the ratio. The method is described in ``docs/benchmarks.md``.
"""

from __future__ import annotations

import gc
import importlib.metadata as md
import time
from typing import Any, TypedDict

from examples.support_store import make_agent
from examples.support_store.backend import SupportStoreBackend
from examples.support_store.policies import PLAN, RefundPolicy
from kernel.chain import ChainRow
from kernel.context import KernelContext
from kernel.record import TrajectoryRecord
from kernel.states import StopReason
from ops.bench import kernel_instructions
from ops.bench.peers import Peer, installed
from store.in_process import InProcessStore
from worker.embedded import EmbeddedRunner
from worker.models import ScriptedModel

GOAL = "refund the damaged item on order ord_1001"
EFFECTS = [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
TOOL_CALLS = ["get_order", "issue_refund", "send_status_email"]
INSTRUCTION_TRAJECTORIES = 30  # counted under callgrind, each side (about a minute each)


def reins_once(ctx: KernelContext, store: InProcessStore, i: int) -> None:
    """One scenario-A trajectory, every step committed to the store as bytes."""
    backend = SupportStoreBackend()

    def commit(prev: TrajectoryRecord, new: TrajectoryRecord, rows: list[ChainRow]) -> None:
        assert store.compare_and_set(new, prev.record_version, rows) == new.record_version

    rec = TrajectoryRecord.create(
        trajectory_id=f"bench-{i}",
        tenant="bench",
        user="cu_ana",
        goal=GOAL,
        agent="examples.support_store:agent",
        budget=ctx.agent.budget,
        now=0.0,
    )
    store.create(rec)
    runner = EmbeddedRunner(ctx, ScriptedModel(RefundPolicy()), backend, commit=commit)
    out = runner.run(rec)
    assert out.record.stop_reason is StopReason.DONE
    assert backend.effects() == EFFECTS
    if i < 0:  # outside the timed rounds: the stored bytes are the final record
        assert store.load("bench", rec.trajectory_id) == out.record


class GraphState(TypedDict):
    """The LangGraph side's state: what the same policy needs to decide."""

    goal: str
    plan: list[dict[str, Any]]
    facts: dict[str, Any]
    last_result: dict[str, Any] | None
    reply: dict[str, Any] | None
    steps: int
    tool_calls: list[str]


def build_graph() -> Any:
    """A model node and a tool node with a conditional edge, checkpointed to InMemorySaver."""
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph

    policy = RefundPolicy()
    facts_of = {
        "get_order": ("order_status", "total_cents", "refunded_cents"),
        "issue_refund": ("refunded_cents",),
        "send_status_email": ("sent",),
    }

    def model(state: GraphState) -> dict[str, Any]:
        view = {
            "goal": state["goal"],
            "plan": state["plan"],
            "facts": state["facts"],
            "last_result": state["last_result"],
        }
        reply, _latency = policy(view, state["steps"] + 1)
        update: dict[str, Any] = {"reply": reply, "steps": state["steps"] + 1}
        if reply["type"] == "plan":
            update["plan"] = [{**s, "status": "pending"} for s in PLAN]
        return update

    def tools(state: GraphState, config: RunnableConfig) -> dict[str, Any]:
        backend: SupportStoreBackend = config["configurable"]["backend"]
        reply = state["reply"] or {}
        name, args = reply["name"], reply["args"]
        key = f"{config['configurable']['thread_id']}:{reply.get('plan_step')}"
        # One attempt per key and no recovery on this side: the lowest fencing token serves.
        result, _secs = backend.call("cu_ana", name, args, key, 30.0, fence=0)
        facts = dict(state["facts"])
        plan = [dict(s) for s in state["plan"]]
        if result.get("status") == "ok":
            for f in facts_of[name]:
                if f in result:
                    facts[f"{args['order_id']}.{f}"] = result[f]
            for s in plan:
                if s["id"] == reply.get("plan_step"):
                    s["status"] = "done"
        return {
            "facts": facts,
            "plan": plan,
            "last_result": result,
            "tool_calls": [*state["tool_calls"], name],
        }

    def route(state: GraphState) -> str:
        kind = (state["reply"] or {}).get("type")
        return "tools" if kind == "tool" else ("model" if kind == "plan" else END)

    g = StateGraph(GraphState)
    g.add_node("model", model)
    g.add_node("tools", tools)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, {"tools": "tools", "model": "model", END: END})
    g.add_edge("tools", "model")
    return g.compile(checkpointer=InMemorySaver())


def langgraph_once(graph: Any, i: int) -> None:
    """The same trajectory on LangGraph, synchronous durability."""
    backend = SupportStoreBackend()
    config = {"configurable": {"thread_id": f"bench-{i}", "backend": backend}}
    init: GraphState = {
        "goal": GOAL,
        "plan": [],
        "facts": {},
        "last_result": None,
        "reply": None,
        "steps": 0,
        "tool_calls": [],
    }
    final = graph.invoke(init, config=config, durability="sync")
    assert final["reply"]["type"] == "final" and final["steps"] == 5
    assert final["tool_calls"] == TOOL_CALLS
    assert backend.effects() == EFFECTS


def peer() -> Peer:
    """LangGraph, checkpointing every step synchronously in memory, as reins commits it."""
    return Peer(
        name="LangGraph",
        version=installed("langgraph"),
        path="StateGraph compiled with InMemorySaver (langgraph-checkpoint "
        f"{installed('langgraph-checkpoint')}), invoke(durability='sync'), in this process",
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Alternate rounds of both sides; report trajectories per second and their ratio."""
    rounds, per_round = (2, 20) if quick else (6, 150)
    ctx = KernelContext(make_agent().profile)
    graph = build_graph()
    store = InProcessStore()
    reins_s = lang_s = 0.0
    n = 0
    reins_once(ctx, store, -1)  # warm both sides
    langgraph_once(graph, -1)
    for _ in range(rounds):
        gc.collect()  # each side starts on a clean heap: neither pays for the other's garbage
        t0 = time.perf_counter()
        for j in range(per_round):
            reins_once(ctx, store, n + j)
        t1 = time.perf_counter()
        gc.collect()
        t1b = time.perf_counter()
        for j in range(per_round):
            langgraph_once(graph, n + j)
        t2 = time.perf_counter()
        reins_s += t1 - t0
        lang_s += t2 - t1b
        n += per_round
    reins_rate, lang_rate = n / reins_s, n / lang_s
    return {
        "bench": "kernel",
        "peer": peer().as_json(),
        "trajectories": n,
        "reins_traj_per_s": round(reins_rate, 1),
        "langgraph_traj_per_s": round(lang_rate, 1),
        "ratio": round(reins_rate / lang_rate, 2),
        "reins_version": md.version("reins"),
        "langgraph_version": md.version("langgraph"),
        "steps_per_trajectory": 5,
        **_instructions(quick),
    }


def _instructions(quick: bool) -> dict[str, Any]:
    """Instructions per trajectory of each side, by callgrind (``kernel_instructions``):
    the figure that does not move with the machine's load. Left out of a quick run."""
    if quick or not kernel_instructions.available():
        return {}
    reins = kernel_instructions.per_trajectory("reins", INSTRUCTION_TRAJECTORIES)
    lang = kernel_instructions.per_trajectory("langgraph", INSTRUCTION_TRAJECTORIES)
    return {
        "reins_instructions_per_traj": round(reins),
        "langgraph_instructions_per_traj": round(lang),
        "instruction_ratio": round(lang / reins, 2),
    }
