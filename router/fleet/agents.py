"""Agent modules loaded by reference (``MODULE:AGENT``), once per process.

A record names its agent; routers (admission) and workers (turns) both load it through
:class:`AgentCache`, which imports each module once and keeps its kernel context.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from kernel.agent import AgentModule
from kernel.authority import AuthorityLookup
from kernel.context import KernelContext
from kernel.errors import UnknownAgent
from router.fleet.routes import ROUTES, ModelRoutes, RouteTable


class Resolved(NamedTuple):
    """What ``MODULE:NAME`` named: the module's name, the name, and the object (None if the
    module lacks it)."""

    module_name: str
    name: str
    found: Any


def resolve(ref: str, kind: str) -> Resolved:
    """Import ``MODULE:NAME`` (:class:`Resolved`).

    A reference of the wrong form, or a module that cannot be imported, is refused naming it.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise UnknownAgent(f"{kind} reference {ref!r} must look like MODULE:NAME")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownAgent(f"{kind} module {module_name!r} cannot be imported: {exc}") from None
    return Resolved(module_name, attr, getattr(module, attr, None))


def load_agent(ref: str) -> AgentModule:
    """Import ``MODULE:AGENT``; refuse a reference that does not name an agent."""
    module_name, attr, agent = resolve(ref, "agent")
    if not isinstance(agent, AgentModule):
        raise UnknownAgent(f"{module_name} has no agent named {attr!r}")
    return agent


def load_factory(ref: str) -> Callable[..., Any]:
    """Import ``MODULE:NAME`` and return the callable it names; refuse anything else."""
    module_name, attr, found = resolve(ref, "factory")
    if not callable(found):
        raise UnknownAgent(f"{module_name} has no callable named {attr!r}")
    factory: Callable[..., Any] = found
    return factory


class AgentCache:
    """Agent modules and their kernel contexts by reference; thread-safe, loaded once each.

    An unknown reference raises :class:`UnknownAgent` every time it is asked for (nothing is
    cached for it), so a deployment that adds the module later is picked up. With ``allowed``,
    a reference it refuses raises :class:`UnknownAgent` before anything is imported (asked on
    every call, so an agent taken off the lists is refused from then on).

    An agent whose model is routed (provider ``routes``) gets a kernel context priced by the
    routes ``routing`` gives (the fleet's document in force): reserved at the dearest route,
    settled at the route a reply names; a new version of the model's routes builds a new
    context, once. With ``authority``, every context looks up its tenant's grants, freeze
    and escalation through it (the fleet's document in force).
    """

    def __init__(
        self,
        allowed: Callable[[str], bool] | None = None,
        routing: Callable[[], RouteTable] | None = None,
        authority: AuthorityLookup | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._agents: dict[str, tuple[AgentModule, KernelContext]] = {}
        self._priced: dict[str, tuple[ModelRoutes, KernelContext]] = {}
        self.allowed = allowed
        self.routing = routing
        self.authority = authority  # tenants' grants, freezes, escalation: every context

    def get(self, ref: str) -> tuple[AgentModule, KernelContext]:
        """The agent and its kernel context; raises :class:`UnknownAgent`."""
        if self.allowed is not None and not self.allowed(ref):
            raise UnknownAgent(f"agent {ref!r} is on no tenant's list of agents")
        found = self._agents.get(ref)
        if found is None:
            agent = load_agent(ref)
            found = (agent, KernelContext(agent.profile, authority=self.authority))
            with self._lock:
                found = self._agents.setdefault(ref, found)
        if self.routing is not None and found[0].profile.model.provider == ROUTES:
            return found[0], self._routed(ref, found[0])
        return found

    def _routed(self, ref: str, agent: AgentModule) -> KernelContext:
        """The context of a routed agent, priced by the model's routes in force (the
        profile's own price while the document routes no such model)."""
        model = agent.profile.model
        assert self.routing is not None
        entry = self.routing().get(model.name)
        if entry is None:
            return self._agents[ref][1]
        held = self._priced.get(ref)
        if held is not None and held[0] is entry:
            return held[1]
        priced = dataclasses.replace(model, price=entry.worst_price(), route_prices=entry.prices())
        ctx = KernelContext(
            dataclasses.replace(agent.profile, model=priced), authority=self.authority
        )
        with self._lock:
            self._priced[ref] = (entry, ctx)
        return ctx

    def context(self, ref: str) -> KernelContext:
        """The kernel context of ``ref``."""
        return self.get(ref)[1]
