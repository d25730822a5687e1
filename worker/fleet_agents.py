"""Models and tool backends as a fleet worker holds them, per agent (:class:`TurnTools`).

A worker builds the model of a turn (:class:`PacedModel` for scripted providers, so their
latency really elapses in the worker thread and honours the cancel token) and keeps one tool
backend per agent, built by the backend factory the worker was started with (the agent's own
``make_backend`` unless told otherwise: a fleet shares one backend service, such as the
support store's Redis state, across every worker).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from kernel.agent import AgentModule, AgentProfile
from kernel.events import ReplyStatus
from kernel.tools import ToolBackend, ToolSpec
from router.fleet.agents import AgentCache
from router.fleet.routes import ROUTES
from store.memory_base import MemoryBank
from worker.memory_tools import Embeds
from worker.models import Model, ModelReply, ScriptedModel
from worker.providers import make_model, with_model
from worker.providers.http import PoolOptions
from worker.routes import RouteModels, Unrouted

#: Builds the tool backend a worker uses for one agent: (agent, its reference) -> backend.
BackendFactory = Callable[[AgentModule, str], ToolBackend]


class PacedModel:
    """A scripted model whose latency elapses in wall time, in the calling thread.

    The reply is the scripted one; the thread then waits ``latency_s`` (or, when None, the
    latency the policy reports) on the cancel token, capped by the call's timeout. A cancel
    during the wait ends the call at once as CANCELED, the scripted text kept as partial
    output (diagnostics only). The reported latency is the time that really elapsed.
    """

    def __init__(self, inner: ScriptedModel, latency_s: float | None) -> None:
        self.inner, self.latency_s = inner, latency_s

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """Answer from the script after the latency; see the class docstring."""
        start = time.monotonic()
        reply = self.inner.call(view, max_output_tokens, timeout_s, cancel=cancel)
        if reply.status is ReplyStatus.CANCELED:
            return reply
        pace = reply.latency_s if self.latency_s is None else self.latency_s
        pace = max(min(pace, timeout_s), 0.0)
        canceled = False
        if pace > 0:
            if cancel is not None:
                canceled = cancel.wait(pace)
            else:
                time.sleep(pace)
        elapsed = round(time.monotonic() - start, 6)
        if canceled:
            return ModelReply(
                status=ReplyStatus.CANCELED,
                latency_s=elapsed,
                partial=reply.raw,
                detail="canceled while the reply was in flight",
            )
        return reply.model_copy(update={"latency_s": elapsed})


@dataclass
class ModelOverrides:
    """A worker's provider settings that replace every profile's (``reins worker`` options)."""

    provider: str | None = None
    base_url: str | None = None
    name: str | None = None
    api_key_env: str | None = None
    scripted_latency_s: float | None = None


@dataclass
class TurnTools:
    """Per agent: the model factory and the tool backend a worker uses for its turns."""

    agents: AgentCache
    env: Mapping[str, str]
    overrides: ModelOverrides = field(default_factory=ModelOverrides)
    backend_factory: BackendFactory | None = None
    memory: MemoryBank | None = None  # where the memory tools and episodes go (None: nowhere)
    pool_options: PoolOptions = field(default_factory=PoolOptions)  # each route's connections
    routes: RouteModels | None = None  # routed models (provider "routes"): the fleet's document
    embedder: Embeds | None = None  # ranks recalled facts (REINS_EMBEDDINGS_URL); None: text only
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _backends: dict[str, ToolBackend] = field(default_factory=dict)
    _providers: dict[str, Model] = field(default_factory=dict)
    # per agent: the module its profile was made from, and the profile with the overrides
    _profiles: dict[str, tuple[AgentModule, AgentProfile]] = field(default_factory=dict)

    def backend(self, ref: str) -> ToolBackend:
        """The one tool backend of agent ``ref`` in this worker (built on first use)."""
        found = self._backends.get(ref)
        if found is None:
            agent = self.agents.get(ref)[0]
            with self._lock:
                found = self._backends.get(ref)
                if found is None:
                    factory = self.backend_factory
                    found = factory(agent, ref) if factory else agent.make_backend()
                    self._backends[ref] = found
        return found

    def profile(self, ref: str) -> AgentProfile:
        """The agent's profile with this worker's model overrides applied."""
        return self._profile(ref, self.agents.get(ref)[0])

    def _profile(self, ref: str, agent: AgentModule) -> AgentProfile:
        """``agent``'s profile with the overrides, made once per module the cache hands out."""
        found = self._profiles.get(ref)
        if found is None or found[0] is not agent:
            o = self.overrides
            found = self._profiles[ref] = (
                agent,
                with_model(
                    agent.profile,
                    provider=o.provider,
                    base_url=o.base_url,
                    name=o.name,
                    api_key_env=o.api_key_env,
                ),
            )
        return found[1]

    def route(self, ref: str) -> str:
        """The provider route (``provider/model``) the agent's calls take from this worker."""
        model = self.profile(ref).model
        return f"{model.provider}/{model.name}"

    def model(self, ref: str, goal: str) -> Model:
        """The model for one turn of a trajectory of agent ``ref`` with ``goal``.

        Scripted providers are built per turn (their policy reads the goal) and paced; routed
        ones come from the fleet's document in force (:mod:`worker.routes`); other providers
        are built once per agent and shared by the worker's threads.
        """
        agent = self.agents.get(ref)[0]
        profile = self._profile(ref, agent)
        if profile.model.provider == ROUTES:
            if self.routes is None:
                return Unrouted(profile.model.name)
            return self.routes.model(ref, profile.model.name, list(profile.catalog.tools.values()))
        if profile.model.provider == "scripted":
            policy = agent.make_policy(goal)
            return PacedModel(ScriptedModel(policy), self.overrides.scripted_latency_s)
        found = self._providers.get(ref)
        if found is None:
            with self._lock:
                found = self._providers.get(ref)
                if found is None:
                    found = make_model(
                        profile,
                        agent.make_policy(goal),
                        self.env,
                        pool_options=self.pool_options,
                    )
                    self._providers[ref] = found
        return found
