"""A routed model: one model name served by provider routes in order, falling back on refusal.

:class:`RoutedModel` is a :class:`~worker.models.Model` over the routes of a model name
(``router/fleet/routes.py``), tried in their order within the call's one deadline. Before it
sends on a route it debits the route's gate under a lease of its own (kept alive while the call
runs); a gate that refuses (paused by a retry-after, at its concurrency, out of quota) skips the
route with nothing sent. After each reply it applies the reply's rate-limit feedback to the
route's gate, then settles the lease with the tokens used. It falls back to the next route only
on REJECTED or TRANSPORT_FAILURE that streamed nothing and reported no usage (so nothing was
produced and nothing billed) with time left and no cancel; any other reply is the call's reply.
The reply names the route that answered and the routes tried before it (the chain keeps both).
When no route could be tried and some were only busy (at their concurrency or quota, not
paused), the call waits for a slot, a doubling pause within its deadline, as a tool gate's
dispatch does (ADR 0122): a turn that came back at once would only be admitted again.

Feedback on a route stays on its gate; what reaches the model's admission gate (through the
turn's notice) is only a wait for when every route refused: the earliest moment one reopens.
When no route could be tried at all, the reply is REJECTED with zero usage (nothing was sent).
Design: docs/adr/0201-model-routes.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kernel.amounts import Usage
from kernel.events import ReplyStatus
from kernel.render import estimate_tokens
from kernel.tools import ToolSpec
from router.admission.feedback import Feedback, feedback_from
from router.admission.gates import GateReading
from worker.models import Model, ModelReply

log = logging.getLogger("reins.worker.routes")
FALLS_BACK = frozenset({ReplyStatus.REJECTED, ReplyStatus.TRANSPORT_FAILURE})
WAIT_S = (0.02, 0.5)  # first and longest pause before trying busy routes again


class RouteGates(Protocol):
    """What a routed model needs of the shared gates."""

    def debit(self, route: str, lease_id: str, tokens: int) -> GateReading: ...

    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> GateReading: ...

    def observe(self, route: str, feedback: Feedback) -> GateReading: ...


class Leases(Protocol):
    """What keeps a lease alive while its call runs (``worker.leases.LeaseKeeper``)."""

    def hold(self, route: str, lease: str, ttl_s: float) -> bool: ...

    def drop(self, lease: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """One route as a routed model calls it: its name, its gate, the provider, or why it
    cannot be called from here (its key does not resolve on this worker)."""

    name: str
    gate: str
    lease_ttl_s: float
    provider: Model | None
    unusable: str | None = None


def falls_back(reply: ModelReply) -> bool:
    """A refusal or transport failure that produced nothing and billed nothing."""
    return (
        reply.status in FALLS_BACK
        and not reply.timed_out
        and reply.partial is None
        and reply.raw is None
        and reply.usage is None
    )


class RoutedModel:
    """See the module docstring. ``gates`` None calls every route ungated (tests, one process)."""

    def __init__(
        self,
        model: str,
        targets: Sequence[Target],
        *,
        gates: RouteGates | None = None,
        leases: Leases | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.model, self.targets = model, tuple(targets)
        self.gates, self.leases = gates, leases
        self.clock, self.wall = clock, wall

    def call(
        self,
        view: str,
        max_output_tokens: int,
        timeout_s: float,
        *,
        tools: Sequence[ToolSpec] | None = None,
        cancel: threading.Event | None = None,
    ) -> ModelReply:
        """Call the routes in order (see the module docstring); never raises."""
        start = self.clock()
        deadline = start + timeout_s
        tokens = estimate_tokens(view) + max_output_tokens
        wait = WAIT_S[0]
        while True:
            tried = self._pass(view, max_output_tokens, deadline, tokens, tools, cancel)
            if tried.answered:
                return self._answered(tried)
            if (
                tried.stopped
                or not tried.busy
                or self.clock() + wait >= deadline
                or _stopped(cancel, wait)
            ):
                return self._unanswered(tried, cancel, start)
            wait = min(wait * 2, WAIT_S[1])  # a busy route frees a slot when a call settles

    def _pass(
        self,
        view: str,
        cap: int,
        deadline: float,
        tokens: int,
        tools: Sequence[ToolSpec] | None,
        cancel: threading.Event | None,
    ) -> _Pass:
        """One try of the routes in order."""
        tried = _Pass()
        for target in self.targets:
            left = deadline - self.clock()
            if (cancel is not None and cancel.is_set()) or left <= 0:
                tried.stopped = True
                break
            if target.provider is None:
                tried.passed(target.name, f"{target.unusable}", math.inf)
                continue
            lease = self._debit(target, tokens)
            if isinstance(lease, GateReading):
                tried.passed(target.name, f"gate {lease.reason}", self._reopens(lease))
                continue
            reply = self._send(target, lease, view, cap, left, tools, cancel)
            tried.sent = (reply, target)
            if not falls_back(reply) or target is self.targets[-1]:
                tried.answered = True
                break
            rejected = reply.status is ReplyStatus.REJECTED
            tried.passed(
                target.name, reply.status.value, reply.retry_after_s if rejected else math.inf
            )
        return tried

    # --- one route -------------------------------------------------------------------------

    def _debit(self, target: Target, tokens: int) -> str | GateReading | None:
        """A lease on the route's gate (None: no gate here), or the refusing reading."""
        if self.gates is None:
            return None
        lease = f"rt-{uuid.uuid4().hex[:20]}"
        reading = self.gates.debit(target.gate, lease, tokens)
        if reading.ok:
            if self.leases is not None:
                self.leases.hold(target.gate, lease, target.lease_ttl_s)
            return lease
        if reading.reason == "unknown_route":  # not configured (yet): no limit to keep
            return None
        return reading

    def _send(
        self,
        target: Target,
        lease: str | None,
        view: str,
        cap: int,
        left: float,
        tools: Sequence[ToolSpec] | None,
        cancel: threading.Event | None,
    ) -> ModelReply:
        assert target.provider is not None
        try:
            reply = target.provider.call(view, cap, left, tools=tools, cancel=cancel)
        except Exception as exc:  # a provider never raises; one that does must not end a turn
            log.exception("route %s of %s raised", target.name, self.model)
            reply = ModelReply(status=ReplyStatus.FAULTED, detail=f"provider error: {exc!r}")
        finally:
            if lease is not None and self.leases is not None:
                self.leases.drop(lease)
        if lease is not None and self.gates is not None:
            # The pause first, then the freed slot: nothing slips in between on this route.
            if reply.retry_after_s is not None or reply.rate_limits:
                fed = feedback_from(reply.rate_limits, reply.retry_after_s, self.wall())
                self.gates.observe(target.gate, fed)
            used = reply.usage.total if reply.usage is not None else None
            self.gates.settle(target.gate, lease, used)
        return reply

    def _reopens(self, reading: GateReading) -> float | None:
        """Seconds until a refusing gate's pause ends; None when the route is only busy (at
        its concurrency or its window's quota: a slot frees when another call settles)."""
        if reading.reason != "paused":
            return None
        return max(reading.paused_until - self.wall(), 0.0)

    # --- the call's reply --------------------------------------------------------------------

    def _answered(self, tried: _Pass) -> ModelReply:
        """The reply of the route that answered, naming it and the routes passed before it;
        its quota news stayed on its gate, and only a wait for every route reaches the
        model's gate."""
        assert tried.sent is not None
        reply, target = tried.sent
        waits = [*tried.waits]
        if falls_back(reply):  # the last route refused too
            waits.append(reply.retry_after_s if reply.status is ReplyStatus.REJECTED else math.inf)
        return reply.model_copy(
            update={
                "route": target.name,
                "fell_back": tried.why(but=target.name),
                "rate_limits": {},
                "retry_after_s": _earliest(waits) if falls_back(reply) else None,
            }
        )

    def _unanswered(self, tried: _Pass, cancel: threading.Event | None, start: float) -> ModelReply:
        """No route answered: canceled, out of time, or every route passed over."""
        latency = round(max(self.clock() - start, 0.0), 6)
        if cancel is not None and cancel.is_set():
            reply = ModelReply(status=ReplyStatus.CANCELED, latency_s=latency, detail="canceled")
            return reply.model_copy(update={"fell_back": tried.why()})
        if tried.stopped:
            why = "while falling back" if tried.sent else "before any route was tried"
            reply = ModelReply(
                status=ReplyStatus.TRANSPORT_FAILURE,
                timed_out=True,
                latency_s=latency,
                detail=f"the deadline ran out {why}",
            )
            return reply.model_copy(update={"fell_back": tried.why()})
        if tried.sent is not None:  # one refused, the others were passed over: its reply
            reply, target = tried.sent
            return reply.model_copy(
                update={
                    "route": target.name,
                    "fell_back": tried.why(but=target.name),
                    "rate_limits": {},
                    "retry_after_s": _earliest(tried.waits),
                }
            )
        return ModelReply(  # nothing left this worker: nothing was used
            status=ReplyStatus.REJECTED,
            usage=Usage(),
            latency_s=latency,
            retry_after_s=_earliest(tried.waits),
            detail=f"no route of {self.model} could take the call: " + "; ".join(tried.why()),
            fell_back=tried.why(),
        )


@dataclass
class _Pass:
    """What one try of the routes in order saw."""

    routes: list[tuple[str, str]] = field(default_factory=list)  # passed over: (route, why)
    waits: list[float | None] = field(default_factory=list)  # when each may serve again
    sent: tuple[ModelReply, Target] | None = None  # the last reply a route gave, and the route
    answered: bool = False  # ``sent`` is the call's reply
    stopped: bool = False  # canceled, or out of time, before the routes ran out

    def passed(self, route: str, why: str, wait: float | None) -> None:
        """A route passed over or fallen back from; ``wait`` None: it is only busy, inf: it
        will not serve from here."""
        self.routes.append((route, why))
        self.waits.append(wait)

    @property
    def busy(self) -> bool:
        """Some route was only busy: a slot may free up any moment."""
        return any(w is None for w in self.waits)

    def why(self, but: str | None = None) -> tuple[str, ...]:
        """Each route passed over, ``"route: why"``, but the one named."""
        return tuple(f"{r}: {w}" for r, w in self.routes if r != but)


def _earliest(waits: list[float | None]) -> float | None:
    """When the first route may serve again: the smallest wait, if every route gave one
    (infinite for a route that will not serve from here: no wait then)."""
    if not waits or any(w is None for w in waits):
        return None
    first = min(w for w in waits if w is not None)
    return None if math.isinf(first) else first


def _stopped(cancel: threading.Event | None, wait: float) -> bool:
    """Pause ``wait`` seconds, or until canceled; True when canceled."""
    if cancel is None:
        time.sleep(wait)
        return False
    return cancel.wait(wait)
