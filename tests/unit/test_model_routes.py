"""Routes in the fleet's document: what is refused (naming the field), the gates they add, the
prices the kernel gets for a routed agent."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from kernel.amounts import ModelPrice
from kernel.errors import ConfigError
from router.fleet.agents import AgentCache
from router.fleet.config import parse_document, parse_routes
from router.fleet.routes import RouteTable, fixed, model_gate, route_gate

D = Decimal
PRICE = {"input_per_m": "2", "cached_input_per_m": "0.5", "output_per_m": "8"}
DEAR = {"input_per_m": "3", "cached_input_per_m": "0.3", "output_per_m": "15"}


def document(**model: Any) -> dict[str, Any]:
    routes = [
        {
            "name": "a",
            "protocol": "openai-compatible",
            "base_url": "https://a.example/v1",
            "api_key_env": "A_KEY",
            "gates": {"concurrency": 2},
        },
        {
            "name": "b",
            "protocol": "anthropic",
            "base_url": "https://b.example",
            "api_key_file": "/run/secrets/b",
            "price": DEAR,
        },
    ]
    entry = {"price": PRICE, "routes": routes, **model}
    return {
        "quantum_tokens": 1000,
        "credit_cap_tokens": 12000,
        "tenants": [
            {
                "name": "acme",
                "weight": 1,
                "max_ready": 10,
                "largest_call_tokens": 8000,
                "agents": ["examples.support_store:agent_routed"],
            }
        ],
        "models": {"refund-policy": entry},
    }


def refused(doc: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_document(doc)
    return caught.value


def test_a_document_with_routes_adds_the_model_and_route_gates() -> None:
    _, gates = parse_document(document(gates={"concurrency": 8}))
    assert gates is not None
    assert (
        set(gates.routes)
        == {
            model_gate("refund-policy"),
            route_gate("refund-policy", "a"),
            route_gate("refund-policy", "b"),
        }
        == {"routes/refund-policy", "routes/refund-policy/a", "routes/refund-policy/b"}
    )
    assert gates.routes["routes/refund-policy"].concurrency == 8
    assert gates.routes["routes/refund-policy/a"].concurrency == 2


def test_an_unknown_protocol_is_refused_naming_the_field() -> None:
    doc = document()
    doc["models"]["refund-policy"]["routes"][1]["protocol"] = "grpc"
    error = refused(doc)
    assert error.field == "models.refund-policy.routes['b'].protocol"
    assert "unknown protocol 'grpc'" in str(error) and "anthropic" in str(error)


@pytest.mark.parametrize(
    "url",
    ["api.openai.com/v1", "ftp://a.example", "https://", "https://user:pw@a.example", "http://a:x"],
)
def test_a_malformed_base_url_is_refused_naming_the_field(url: str) -> None:
    doc = document()
    doc["models"]["refund-policy"]["routes"][0]["base_url"] = url
    error = refused(doc)
    assert error.field == "models.refund-policy.routes['a'].base_url"
    assert "pw" not in str(error)  # a URL with credentials is never echoed


def test_a_route_without_a_price_is_refused_naming_the_field() -> None:
    doc = document()
    del doc["models"]["refund-policy"]["price"]
    error = refused(doc)
    assert error.field == "models.refund-policy.routes['a'].price"  # b has its own


def test_other_bad_routes_are_refused() -> None:
    doubled = document()
    doubled["models"]["refund-policy"]["routes"][1]["name"] = "a"
    assert "more than once" in str(refused(doubled))
    both = document()
    both["models"]["refund-policy"]["routes"][0]["api_key_file"] = "/k"
    assert refused(both).field == "models.refund-policy.routes['a']"
    empty = document(routes=[])
    assert refused(empty).field == "models.refund-policy.routes"
    named = document()
    named["models"] = {"bad name{}": named["models"]["refund-policy"]}
    assert refused(named).field == "models.bad name{}"
    extra = document()
    extra["models"]["refund-policy"]["routes"][0]["api_key"] = "sk-live-123"  # never a key
    error = refused(extra)
    assert error.field == "models.refund-policy.routes['a'].api_key"
    assert "sk-live-123" not in str(error)


def test_a_gate_of_a_routed_model_is_set_under_models_not_gates() -> None:
    doc = document()
    doc["gates"] = {"routes": {"routes/refund-policy/a": {"rpm": 5}}}
    assert refused(doc).field == "gates.routes"


def test_refusing_changes_nothing_of_the_parsed_input() -> None:
    doc = document()
    doc["models"]["refund-policy"]["routes"][0]["protocol"] = "grpc"
    before = copy.deepcopy(doc)
    refused(doc)
    assert doc == before


def test_a_routed_agent_is_reserved_at_the_dearest_route_and_settled_at_its_own() -> None:
    table = parse_routes(document())
    cache = AgentCache(routing=fixed(table))
    model = cache.context("examples.support_store:agent_routed").agent.model
    assert model.price == ModelPrice(
        input_per_m=D(3), cached_input_per_m=D("0.5"), output_per_m=D(15)
    )
    assert model.price_of("a") == ModelPrice.model_validate(PRICE)
    assert model.price_of("b") == ModelPrice.model_validate(DEAR)
    assert model.price_of(None) == model.price == model.price_of("gone")


def test_a_new_version_of_the_routes_prices_a_new_context_once() -> None:
    table: list[RouteTable] = [parse_routes(document())]
    cache = AgentCache(routing=lambda: table[0])
    ref = "examples.support_store:agent_routed"
    first = cache.context(ref)
    assert cache.context(ref) is first  # the same version: the same context
    cheaper = document()
    cheaper["models"]["refund-policy"]["routes"][1]["price"] = PRICE
    table[0] = parse_routes(cheaper)
    second = cache.context(ref)
    assert second is not first and second.agent.model.price.output_per_m == D(8)
    table[0] = RouteTable({})
    assert cache.context(ref).agent.model.price.output_per_m == D(15)  # the profile's own
