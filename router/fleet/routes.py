"""Model routes in the fleet's document: a model name served by one or more provider routes.

An agent whose profile names the provider ``routes`` calls its model through the routes the
document's ``models`` section lists for that name, in order, falling back to the next on a
REJECTED or TRANSPORT_FAILURE reply that streamed nothing (``worker/providers/routed.py``)::

    [models."gpt-4o-mini"]
    price = { input_per_m = "0.15", cached_input_per_m = "0.075", output_per_m = "0.60" }
    gates = { concurrency = 32 }                  # the model's admission gate (optional)
    [[models."gpt-4o-mini".routes]]
    name = "openai"
    protocol = "openai-compatible"                # or "anthropic"
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"                # or api_key_file = "/var/run/secrets/..."
    gates = { rpm = 500, tpm = 200000, concurrency = 16 }
    # price = { ... }                             # this route's own, else the model's

Each route has a gate of its own, ``routes/<model>/<route>``, which the worker debits before
sending and to which it applies the route's rate-limit feedback; the model has its admission
gate, ``routes/<model>``, which the admitter debits (ADR 0201). A key is referenced by the name
of the environment variable or the path of the mounted file that holds it, resolved on the
worker: the document never holds a key. Every route must have a price (its own or its
model's); the kernel reserves at the dearest of the model's routes and settles at the price of
the route the call took.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kernel.amounts import ModelPrice
from kernel.errors import ConfigError
from router.admission.gates import ProviderLimits

#: The profile provider that calls a model through the document's routes.
ROUTES = "routes"
#: The protocols a route may speak (the provider names of ``worker.providers``).
PROTOCOLS = ("openai-compatible", "anthropic")
# short enough that a route's gate name fits a gate route (ROUTE_RE: 128 characters)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}$")


def model_gate(model: str) -> str:
    """The admission gate of a routed model."""
    return f"{ROUTES}/{model}"


def route_gate(model: str, route: str) -> str:
    """The gate of one of a model's routes."""
    return f"{ROUTES}/{model}/{route}"


class Route(BaseModel):
    """One provider route of a model: how to reach it, its key's reference, its gate, its price."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    protocol: str
    base_url: str
    model: str | None = Field(None, description="the name the provider knows; the model's if unset")
    api_key_env: str | None = None
    api_key_file: str | None = None
    gates: ProviderLimits = Field(default_factory=ProviderLimits)
    price: ModelPrice | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not NAME_RE.match(name):
            raise ValueError(f"must match {NAME_RE.pattern}")
        return name

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, protocol: str) -> str:
        if protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
        return protocol

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, url: str) -> str:
        try:
            parts = urlsplit(url)
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
            parts = urlsplit("")
        if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
            raise ValueError(f"{url!r} is not an http(s) URL with a host")
        if parts.username or parts.password or parts.query or parts.fragment:
            raise ValueError("a base URL holds no credentials, query or fragment")
        return url

    @model_validator(mode="after")
    def _one_key(self) -> Route:
        if self.api_key_env and self.api_key_file:
            raise ValueError("name the key by api_key_env or by api_key_file, not both")
        return self


class ModelRoutes(BaseModel):
    """A model's routes in order of preference, its default price and admission gate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    routes: tuple[Route, ...] = Field(..., min_length=1)
    price: ModelPrice | None = None
    gates: ProviderLimits = Field(default_factory=ProviderLimits)

    @model_validator(mode="after")
    def _complete(self) -> ModelRoutes:
        names = [r.name for r in self.routes]
        doubled = sorted({n for n in names if names.count(n) > 1})
        if doubled:
            raise ValueError(f"route names {doubled} appear more than once")
        return self

    def price_of(self, route: Route) -> ModelPrice:
        """The route's price: its own, else the model's (validation ensures one exists)."""
        price = route.price or self.price
        assert price is not None
        return price

    def prices(self) -> tuple[tuple[str, ModelPrice], ...]:
        """Each route's price, by route name."""
        return tuple((r.name, self.price_of(r)) for r in self.routes)

    def worst_price(self) -> ModelPrice:
        """The dearest rate of each kind over the routes: what admission reserves at."""
        prices = [p for _, p in self.prices()]
        writes_apart = any(p.cache_write_input_per_m is not None for p in prices)
        return ModelPrice(
            input_per_m=max(p.input_per_m for p in prices),
            cached_input_per_m=max(p.cached_input_per_m for p in prices),
            output_per_m=max(p.output_per_m for p in prices),
            cache_write_input_per_m=max(p.cache_write_rate for p in prices)
            if writes_apart
            else None,
        )


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Every routed model of one version of the document, validated."""

    models: Mapping[str, ModelRoutes]

    def get(self, model: str) -> ModelRoutes | None:
        """The routes of ``model``, or None when the document routes no such model."""
        return self.models.get(model)

    def gates(self) -> dict[str, ProviderLimits]:
        """The gates the routes add to the document's: each model's and each route's."""
        out: dict[str, ProviderLimits] = {}
        for model, entry in self.models.items():
            out[model_gate(model)] = entry.gates
            for route in entry.routes:
                out[route_gate(model, route.name)] = route.gates
        return out


NO_ROUTES = RouteTable({})


def fixed(table: RouteTable) -> Callable[[], RouteTable]:
    """Routes that stay ``table`` (a router's version in force; it sets a new one per version)."""
    return lambda: table


def following(peek: Callable[[], Any]) -> Callable[[], RouteTable]:
    """The routes of whatever version ``peek`` (a ``ConfigSource.peek``) gives now."""

    def routes() -> RouteTable:
        fleet = peek()
        found: RouteTable | None = getattr(fleet, "routes", None)
        return found if found is not None else NO_ROUTES

    return routes


def parse_models(data: Any) -> RouteTable:
    """Validate the document's ``models`` section; :class:`ConfigError` naming the field."""
    if data is None:
        return NO_ROUTES
    if not isinstance(data, Mapping):
        raise ConfigError("models must be a table of model names", field="models")
    models: dict[str, ModelRoutes] = {}
    for name, body in data.items():
        where = f"models.{name}"
        if not MODEL_RE.match(str(name)):
            raise ConfigError(f"{where}: a model name must match {MODEL_RE.pattern}", field=where)
        try:
            entry = ModelRoutes.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = _field(where, first["loc"], body)
            msg = str(first["msg"]).removeprefix("Value error, ")
            raise ConfigError(f"{field}: {msg}", field=field) from None
        for route in entry.routes:
            if route.price is None and entry.price is None:
                field = f"{where}.routes[{route.name!r}].price"
                raise ConfigError(
                    f"{field}: route {route.name!r} has no price, and {where} gives none",
                    field=field,
                )
        models[str(name)] = entry
    return RouteTable(models)


def _field(where: str, loc: tuple[int | str, ...], body: Any) -> str:
    """A pydantic location as the document's path, a route named rather than numbered."""
    parts = [where]
    node: Any = body
    for key in loc:
        if isinstance(key, int) and isinstance(node, list | tuple) and 0 <= key < len(node):
            node = node[key]
            name = node.get("name") if isinstance(node, Mapping) else None
            parts[-1] += f"[{name!r}]" if name else f"[{key}]"
            continue
        node = node.get(key) if isinstance(node, Mapping) else None
        parts.append(str(key))
    return ".".join(parts)
