"""The routed models a worker calls, built from the fleet's document in force.

:class:`RouteModels` turns a model's routes (``router/fleet/routes.py``) into a
:class:`~worker.providers.routed.RoutedModel` per agent: a provider per route (the route's
protocol, base URL and model name, the agent's tools, the key its reference resolves to on this
worker) over one pool of connections per route, shared by every agent that calls it. A new
version of the document that changes a route builds it again and closes the old route's
connections; one that leaves a route as it was keeps its pool. A route whose key does not
resolve here is passed over (nothing is sent through it) and logged, naming the reference.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from kernel.events import ReplyStatus
from kernel.tools import ToolSpec
from router.fleet.routes import ModelRoutes, Route, RouteTable, route_gate
from worker.models import Model, ModelReply
from worker.providers import STREAMED
from worker.providers.base import ProviderConfigError
from worker.providers.http import HttpPool, PoolOptions
from worker.providers.keys import KeyRef
from worker.providers.routed import Leases, RoutedModel, RouteGates, Target

log = logging.getLogger("reins.worker.routes")


class Unrouted:
    """The model of an agent whose model the document routes nowhere: every call FAULTED,
    nothing sent (the agent's profile names provider ``routes`` for a name no route serves)."""

    def __init__(self, model: str) -> None:
        self.model = model

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """FAULTED, naming the model; nothing is sent."""
        return ModelReply(
            status=ReplyStatus.FAULTED,
            detail=f"the fleet's document routes no model {self.model!r}",
        )


class RouteModels:
    """Routed models by agent, from ``routes()`` (the document in force); thread-safe."""

    def __init__(
        self,
        routes: Callable[[], RouteTable],
        env: Mapping[str, str],
        *,
        pool_options: PoolOptions | None = None,
        gates: RouteGates | None = None,
        leases: Leases | None = None,
    ) -> None:
        self.routes, self.env = routes, env
        self.pool_options = pool_options or PoolOptions()
        self.gates, self.leases = gates, leases
        self._lock = threading.Lock()
        self._models: dict[str, tuple[ModelRoutes, RoutedModel]] = {}
        self._pools: dict[tuple[str, str], tuple[Route, HttpPool]] = {}

    def model(self, agent: str, name: str, tools: Sequence[ToolSpec]) -> Model:
        """The routed model ``name`` as agent ``agent`` calls it (with its tools)."""
        entry = self.routes().get(name)
        if entry is None:
            return Unrouted(name)
        found = self._models.get(agent)
        if found is not None and found[0] is entry:
            return found[1]
        with self._lock:
            targets = [self._target(name, entry, route, tools) for route in entry.routes]
            routed = RoutedModel(name, targets, gates=self.gates, leases=self.leases)
            self._models[agent] = (entry, routed)
        return routed

    def _target(
        self, name: str, entry: ModelRoutes, route: Route, tools: Sequence[ToolSpec]
    ) -> Target:
        gate = route_gate(name, route.name)
        ref = KeyRef(route.api_key_env, route.api_key_file)
        try:
            key = ref.resolve(self.env)
        except ProviderConfigError as exc:
            log.warning("route %s of %s passed over on this worker: %s", route.name, name, exc)
            return Target(route.name, gate, route.gates.lease_ttl_s, None, f"key: {exc}")
        provider = STREAMED[route.protocol](
            base_url=route.base_url,
            model=route.model or name,
            api_key=key,
            tools=tools,
            pool=self._pool(name, route),
        )
        return Target(route.name, gate, route.gates.lease_ttl_s, provider)

    def _pool(self, name: str, route: Route) -> HttpPool:
        """The route's connections: kept while its definition stands, else closed and made
        again."""
        key = (name, route.name)
        held = self._pools.get(key)
        if held is not None and held[0] == route:
            return held[1]
        if held is not None:
            held[1].close()
        pool = HttpPool(route.base_url, self.pool_options)
        self._pools[key] = (route, pool)
        return pool

    def close(self) -> None:
        """Close every route's connections."""
        with self._lock:
            for _, pool in self._pools.values():
                pool.close()
            self._pools.clear()
            self._models.clear()
