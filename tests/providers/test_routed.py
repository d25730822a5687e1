"""A routed model over loopback servers: fallback on refusal before any output, each route's
gate debited, paused by its own 429 and settled, and the chain naming the route each call took.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from decimal import Decimal
from typing import Any

from examples.support_store import make_agent
from kernel.amounts import Usage
from kernel.context import KernelContext
from kernel.events import ReplyStatus
from router.admission.feedback import Feedback
from router.admission.gates import GateConfig, MemoryGates, ProviderLimits
from router.fleet.routes import parse_models, route_gate
from tests.providers.conftest import Serve
from tests.providers.fake_provider import FakeProvider
from tests.providers.fake_replies import Reply
from tests.providers.scripts import KernelTurns
from worker.leases import LeaseKeeper
from worker.providers import CancelToken
from worker.routes import RouteModels, Unrouted

TOOLS = list(make_agent().profile.catalog.tools.values())
FINAL = json.dumps({"type": "final", "outcome": "completed", "text": "Done."})
PRICE = {"input_per_m": "2", "cached_input_per_m": "0.5", "output_per_m": "8"}
DEAR = {"input_per_m": "3", "cached_input_per_m": "0.3", "output_per_m": "15"}
MODEL = "refund-policy"


def routes_of(*servers: tuple[str, FakeProvider, str], **extra: Any) -> Any:
    """The routed model's entry over ``(name, server, protocol)`` routes, in order."""
    routes = []
    for name, server, protocol in servers:
        url = server.base_url if protocol == "openai-compatible" else server.root_url
        routes.append(
            {
                "name": name,
                "protocol": protocol,
                "base_url": url,
                "api_key_env": f"{name.upper()}_KEY",
                "gates": {"concurrency": 4},
                "price": PRICE if name == "a" else DEAR,
            }
        )
    return parse_models({MODEL: {"routes": routes, **extra}})


def routed(table: Any, gates: MemoryGates | None, env: dict[str, str] | None = None) -> Any:
    env = {"A_KEY": "sk-a", "B_KEY": "sk-b", "C_KEY": "sk-c"} if env is None else env
    leases = LeaseKeeper(gates) if gates is not None else None
    return RouteModels(lambda: table, env, gates=gates, leases=leases).model("agent", MODEL, TOOLS)


def gates_for(table: Any) -> MemoryGates:
    return MemoryGates(GateConfig(routes=table.gates()), time.time)


def test_a_429_falls_back_to_the_next_route_and_pauses_its_own_gate(serve: Serve) -> None:
    a = serve([Reply(status=429, headers={"retry-after": "60"})])
    b = serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "anthropic"))
    gates = gates_for(table)
    model = routed(table, gates)
    first = model.call("{}", 300, 10.0)
    assert first.status is ReplyStatus.COMPLETED and first.route == "b"
    assert first.fell_back == ("a: REJECTED",)
    assert first.rate_limits == {} and first.retry_after_s is None  # A's news stayed on A
    assert a.seen[0].headers["authorization"] == "Bearer sk-a"
    assert b.seen[0].headers["x-api-key"] == "sk-b"
    gate_a = gates.reading(route_gate(MODEL, "a"))
    assert gate_a.paused_until > time.time() + 50  # A backs off for its retry-after
    assert gate_a.leases == 0 and gates.reading(route_gate(MODEL, "b")).leases == 0
    second = model.call("{}", 300, 10.0)
    assert second.route == "b" and second.fell_back == ("a: gate paused",)
    assert len(a.seen) == 1  # nothing more was sent to A while its gate is paused


def test_a_transport_failure_before_any_output_falls_back(serve: Serve) -> None:
    dead = serve([Reply(content=FINAL)])
    b = serve([Reply(content=FINAL)])
    table = routes_of(("a", dead, "openai-compatible"), ("b", b, "openai-compatible"))
    dead.stop()  # connection refused: nothing reached A
    reply = routed(table, gates_for(table)).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.COMPLETED and reply.route == "b"
    assert reply.fell_back == ("a: TRANSPORT_FAILURE",)


def test_no_fallback_once_output_streamed(serve: Serve) -> None:
    a = serve([Reply(content=FINAL, cut_after=3)])
    b = serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "openai-compatible"))
    reply = routed(table, gates_for(table)).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.TRANSPORT_FAILURE and reply.route == "a"
    assert reply.partial == FINAL[:12] and b.seen == []


def test_no_fallback_for_a_reply_that_is_not_a_refusal(serve: Serve) -> None:
    a = serve([Reply(status=401)])
    b = serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "openai-compatible"))
    reply = routed(table, None).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.FAULTED and reply.route == "a" and b.seen == []


def test_when_every_gate_refuses_nothing_is_sent_and_the_earliest_reopening_is_told(
    serve: Serve,
) -> None:
    a, b = serve([Reply(content=FINAL)]), serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "openai-compatible"))
    gates = gates_for(table)
    gates.observe(route_gate(MODEL, "a"), Feedback(retry_after_s=30.0))
    gates.observe(route_gate(MODEL, "b"), Feedback(retry_after_s=10.0))
    reply = routed(table, gates).call("{}", 300, 10.0)
    assert reply.status is ReplyStatus.REJECTED and reply.route is None
    assert reply.usage == Usage()  # nothing was sent: nothing was used
    assert reply.retry_after_s is not None and 8.0 < reply.retry_after_s <= 10.0
    assert reply.fell_back == ("a: gate paused", "b: gate paused")
    assert a.seen == [] and b.seen == []


def test_a_route_whose_key_does_not_resolve_here_is_passed_over(serve: Serve) -> None:
    a, b = serve([Reply(content=FINAL)]), serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "openai-compatible"))
    reply = routed(table, None, env={"B_KEY": "sk-b"}).call("{}", 300, 10.0)
    assert reply.route == "b" and reply.fell_back == ("a: key: A_KEY is not set",)
    assert a.seen == []


def test_a_cancel_during_the_fallback_sends_nothing_more(serve: Serve) -> None:
    token = CancelToken()

    def refuse_then_cancel(request: dict[str, Any], n: int) -> Reply:
        token.set()
        return Reply(status=429)

    a, b = serve(refuse_then_cancel), serve([Reply(content=FINAL)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "openai-compatible"))
    reply = routed(table, None).call("{}", 300, 10.0, cancel=token)
    assert reply.status is ReplyStatus.CANCELED and b.seen == []


def test_an_unrouted_model_is_faulted_sending_nothing() -> None:
    model = RouteModels(lambda: parse_models(None), {}).model("agent", MODEL, TOOLS)
    assert isinstance(model, Unrouted)
    assert model.call("{}", 10, 1.0).status is ReplyStatus.FAULTED


def test_the_chain_names_the_route_and_the_ledger_settles_at_its_price(serve: Serve) -> None:
    a = serve([Reply(status=429, headers={"retry-after": "5"})])
    b = serve([Reply(content=FINAL, prompt_tokens=200, cached_tokens=800)])
    table = routes_of(("a", a, "openai-compatible"), ("b", b, "anthropic"))
    k = KernelTurns()
    entry = table.get(MODEL)
    profile = k.ctx.agent
    model_ref = dataclasses.replace(
        profile.model, price=entry.worst_price(), route_prices=entry.prices()
    )
    k.ctx = KernelContext(dataclasses.replace(profile, model=model_ref))
    cmd = k.admit()
    reply = routed(table, gates_for(table)).call(cmd.view, cmd.max_output_tokens, cmd.timeout_s)
    result = k.reply(cmd, reply)
    row = next(r for r in result.rows if r.kind.value == "model")
    assert row.detail is not None
    assert row.detail["route"] == "b" and row.detail["fell_back"] == ["a: REJECTED"]
    out = b.seen[0].sent_tokens
    # B's own cached rate (0.30), not the reserved worst case's (0.50, route a's)
    assert model_ref.price.cached_input_per_m == Decimal("0.5")
    expected = (Decimal(3) * 200 + Decimal("0.3") * 800 + Decimal(15) * out) / 10**6
    assert k.rec.ledger.dollars.actual == expected


def test_leases_of_a_route_are_kept_alive_while_its_call_runs(serve: Serve) -> None:
    streaming = threading.Event()

    def slow(request: dict[str, Any], n: int) -> Reply:
        streaming.set()
        return Reply(content=FINAL, delay_s=0.05)

    a = serve(slow)
    table = routes_of(("a", a, "openai-compatible"))
    gates = MemoryGates(
        GateConfig(routes={**table.gates(), route_gate(MODEL, "a"): ProviderLimits(concurrency=1)}),
        time.time,
    )
    keeper = LeaseKeeper(gates)
    model = RouteModels(lambda: table, {"A_KEY": "k"}, gates=gates, leases=keeper).model(
        "agent", MODEL, TOOLS
    )
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(model.call("{}", 300, 10.0)))
    worker.start()
    assert streaming.wait(30)
    held = keeper.held()
    assert len(held) == 1 and held[0].startswith("rt-")
    assert gates.reading(route_gate(MODEL, "a")).leases == 1
    worker.join(30)
    assert done[0].status is ReplyStatus.COMPLETED and keeper.held() == []
    assert gates.reading(route_gate(MODEL, "a")).leases == 0


class Watched:
    """The gates, telling the test each time a debit is refused."""

    def __init__(self, gates: MemoryGates) -> None:
        self.gates, self.refused = gates, threading.Event()

    def debit(self, route: str, lease_id: str, tokens: int) -> Any:
        reading = self.gates.debit(route, lease_id, tokens)
        if not reading.ok:
            self.refused.set()
        return reading

    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> Any:
        return self.gates.settle(route, lease_id, used_tokens)

    def observe(self, route: str, feedback: Feedback) -> Any:
        return self.gates.observe(route, feedback)


def one_slot(table: Any) -> MemoryGates:
    """Route b's gate with one slot, taken by another call."""
    gate = route_gate(MODEL, "b")
    gates = MemoryGates(
        GateConfig(routes={**table.gates(), gate: ProviderLimits(concurrency=1)}), time.time
    )
    assert gates.debit(gate, "another-call", 1).ok
    return gates


def test_when_the_routes_are_only_busy_the_call_waits_for_a_slot(serve: Serve) -> None:
    """A turn that came back REJECTED at once would be admitted again at once: busy routes
    are waited for, within the deadline."""
    b = serve([Reply(content=FINAL)])
    table = routes_of(("b", b, "openai-compatible"))
    gates = one_slot(table)
    watched = Watched(gates)
    model = RouteModels(lambda: table, {"B_KEY": "k"}, gates=watched).model("agent", MODEL, TOOLS)
    done: list[Any] = []
    worker = threading.Thread(target=lambda: done.append(model.call("{}", 300, 30.0)))
    worker.start()
    assert watched.refused.wait(30)  # the slot was taken: the call waits
    gates.settle(route_gate(MODEL, "b"), "another-call", 1)  # the other call ends
    worker.join(30)
    assert done[0].status is ReplyStatus.COMPLETED and done[0].route == "b"
    assert done[0].fell_back == () and len(b.seen) == 1


def test_busy_routes_past_the_deadline_are_rejected_with_nothing_sent(serve: Serve) -> None:
    b = serve([Reply(content=FINAL)])
    table = routes_of(("b", b, "openai-compatible"))
    model = RouteModels(lambda: table, {"B_KEY": "k"}, gates=one_slot(table)).model(
        "agent", MODEL, TOOLS
    )
    reply = model.call("{}", 300, 0.3)
    assert reply.status is ReplyStatus.REJECTED and reply.usage == Usage()
    assert reply.retry_after_s is None and reply.fell_back == ("b: gate concurrency",)
    assert b.seen == []
