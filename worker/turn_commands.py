"""Carrying out one command a committed step produced: a model call or a tool call.

Each is done outside any lock, after the step that produced it was committed, and reported back
as the event the kernel steps next. Nothing here writes to the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from kernel.events import (
    CallModel,
    Command,
    DispatchTool,
    Event,
    LookupEffect,
    ToolDeferred,
    ToolResulted,
)
from kernel.record import TrajectoryRecord
from kernel.tools import OnUnknown, ToolKind
from router.fleet.episodes import write_episode
from router.wire.feed import CancelListener
from worker.backend import dispatch
from worker.fleet_agents import TurnTools
from worker.memory_tools import MemoryBackend
from worker.providers.base import InFlightCalls
from worker.tool_gates import NoCapacity, ToolGates

log = logging.getLogger("reins.worker.turn")


@dataclass(frozen=True, slots=True)
class Metered:
    """What a model call's reply says beyond its event: the tokens it used (None: no
    evidence) and what it said about the provider's quota, for the gates."""

    used_tokens: int | None
    retry_after_s: float | None = None
    rate_limits: dict[str, str] = field(default_factory=dict, hash=False)

    @property
    def feedback(self) -> bool:
        """True when the reply said anything about the provider's quota."""
        return self.retry_after_s is not None or bool(self.rate_limits)


class CommandCarrier:
    """Carries out model and tool commands for a worker's turns; safe to call from many threads.

    No call is given more than ``max_call_s`` (``REINS_MAX_TURN_S``), whatever the command allows:
    the routers' sweeps count on a turn's version moving at least that often.
    """

    def __init__(
        self,
        tools: TurnTools,
        calls_in_flight: InFlightCalls,
        listener: CancelListener | None,
        clock: Callable[[], float],
        max_call_s: float = float("inf"),
        tool_gates: ToolGates | None = None,
        on_recall: Callable[[str, bool], None] | None = None,
        look_first: bool = False,
        on_fallback: Callable[[str], None] | None = None,
    ) -> None:
        self.tools, self.calls_in_flight, self.listener, self.clock = (
            tools,
            calls_in_flight,
            listener,
            clock,
        )
        self.max_call_s = max_call_s
        self.tool_gates = tool_gates  # None: no tool's capacity is gated here
        self.on_recall = on_recall  # told whether each recall_facts found anything
        self.on_fallback = on_fallback  # told of each recall whose embedder failed
        self.look_first = look_first  # REINS_LOOK_UP_BEFORE_WRITE (worker.backend.dispatch)

    def carry_out(self, rec: TrajectoryRecord, cmd: Command) -> tuple[Event, Metered | None]:
        """Do what ``cmd`` asks; its event, and for a model call what its reply metered."""
        if isinstance(cmd, CallModel):
            return self.call_model(rec, cmd)
        if isinstance(cmd, DispatchTool | LookupEffect):
            return self.call_tool(rec, cmd), None
        raise TypeError(f"not a command a worker carries out: {cmd!r}")  # pragma: no cover

    def call_model(self, rec: TrajectoryRecord, cmd: CallModel) -> tuple[Event, Metered]:
        """One model call, cancelable through its in-flight token while it runs."""
        token = self.calls_in_flight.open(cmd.call_id)
        try:
            if self.listener is not None and self.listener.recently_canceled(cmd.call_id):
                token.set()  # the cancel came before the call: it ends before it is sent
            model = self.tools.model(rec.agent, rec.goal)
            timeout = min(cmd.timeout_s, self.max_call_s)
            reply = model.call(cmd.view, cmd.max_output_tokens, timeout, cancel=token)
        finally:
            self.calls_in_flight.close(cmd.call_id)
        used = reply.usage.total if reply.usage is not None else None
        metered = Metered(used, reply.retry_after_s, reply.rate_limits)
        return reply.replied(cmd.call_id, self.clock()), metered

    def _capacity(self, cmd: DispatchTool | LookupEffect) -> AbstractContextManager[None]:
        """The tool's fleet-wide capacity, held while a dispatch runs (a lookup needs none)."""
        if self.tool_gates is None or not isinstance(cmd, DispatchTool):
            return nullcontext()
        # Queueing for a slot is bounded (by REINS_MAX_TURN_S too: the routers' sweeps count on
        # a turn's version moving at least that often); past it the wait is reported and
        # committed, and the kernel sends the call again (kernel.backpressure).
        within = min(self.max_call_s, cmd.timeout_s, self.tool_gates.recheck_s)
        return self.tool_gates.held(cmd.tool, cmd.attempt_id, within)

    def _looks_up(self, rec: TrajectoryRecord, cmd: DispatchTool) -> bool:
        """True for a write whose tool resolves an unknown outcome by looking its key up."""
        spec = self.tools.profile(rec.agent).catalog.get(cmd.tool)
        return (
            spec is not None and spec.kind is ToolKind.WRITE and spec.on_unknown is OnUnknown.LOOKUP
        )

    def remember_episode(self, rec: TrajectoryRecord) -> None:
        """Write the episode of ``rec``, which a turn ended, if its agent keeps episodes."""
        if self.tools.memory is not None:
            write_episode(self.tools.memory, rec, self.tools.profile(rec.agent), self.clock())

    def call_tool(
        self, rec: TrajectoryRecord, cmd: DispatchTool | LookupEffect
    ) -> ToolResulted | ToolDeferred:
        """One tool call (or effect lookup) through the agent's backend; a backend that raises
        gives an ``unknown`` outcome for a write, an ``error`` for a read. A dispatch its gate
        had no room for is not sent: its deferral is the event (backpressure, not a result)."""
        backend = self.tools.backend(rec.agent)
        if self.tools.memory is not None:
            backend = MemoryBackend(
                backend,
                self.tools.memory,
                rec.tenant,
                rec.agent,
                self.clock,
                self.on_recall,
                record=rec,
                profile=self.tools.profile(rec.agent),
                embedder=self.tools.embedder,
                on_fallback=self.on_fallback,
            )
        looked_up = isinstance(cmd, LookupEffect)
        if isinstance(cmd, DispatchTool) and cmd.timeout_s > self.max_call_s:
            cmd = cmd.model_copy(update={"timeout_s": self.max_call_s})
        first = self.look_first and isinstance(cmd, DispatchTool) and self._looks_up(rec, cmd)
        try:
            with self._capacity(cmd):
                result, secs = dispatch(backend, rec.user, cmd, look_first=first)
        except NoCapacity as exc:  # the backend was never called: nothing happened
            log.info("%s: tool %s waits: %s", rec.trajectory_id, cmd.tool, exc)
            return ToolDeferred(
                now=self.clock(),
                call_id=cmd.call_id,
                attempt_id=cmd.attempt_id,
                gate=exc.gate,
                reason=exc.reason,
            )
        except Exception as exc:  # the backend failed mid-call: for a write, outcome unknown
            log.warning("%s: tool %s raised %r", rec.trajectory_id, cmd.tool, exc)
            result, secs = {"status": "unknown", "code": "backend_error"}, 0.0
            spec = self.tools.agents.get(rec.agent)[0].profile.catalog.get(cmd.tool)
            if spec is not None and spec.kind is ToolKind.READ:
                result = {"status": "error", "code": "backend_error"}
        return ToolResulted(
            now=self.clock(),
            call_id=cmd.call_id,
            attempt_id=cmd.attempt_id,
            result=result,
            latency_s=secs,
            looked_up=looked_up,
        )
