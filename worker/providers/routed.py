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

Feedback on a route stays on its gate; what reaches the model's admission gate (through the
turn's notice) is only a wait for when every route refused: the earliest moment one reopens.
When no route could be tried at all, the reply is REJECTED with zero usage (nothing was sent).
Design: docs/adr/0201-model-routes.md.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
        tried: list[str] = []
        waits: list[float | None] = []  # per route passed over: when it may serve again
        reply: ModelReply | None = None
        for target in self.targets:
            if cancel is not None and cancel.is_set():
                break
            left = deadline - self.clock()
            if left <= 0:
                break
            if target.provider is None:
                tried.append(f"{target.name}: {target.unusable}")
                waits.append(None)
                continue
            lease = self._debit(target, tokens)
            if isinstance(lease, GateReading):
                tried.append(f"{target.name}: gate {lease.reason}")
                waits.append(self._reopens(lease))
                continue
            reply = self._send(target, lease, view, max_output_tokens, left, tools, cancel)
            if not falls_back(reply) or target is self.targets[-1]:
                return self._answered(reply, target, tried, waits)
            tried.append(f"{target.name}: {reply.status.value}")
            waits.append(reply.retry_after_s if reply.status is ReplyStatus.REJECTED else None)
        return self._unanswered(reply, tried, waits, cancel, start)

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
        """Seconds until a refusing gate's pause ends; None when it refused for another
        reason (a slot may free up any moment)."""
        if reading.reason != "paused":
            return None
        return max(reading.paused_until - self.wall(), 0.0)

    # --- the call's reply --------------------------------------------------------------------

    def _answered(
        self, reply: ModelReply, target: Target, tried: list[str], waits: list[float | None]
    ) -> ModelReply:
        """The reply of the route that answered, naming it; its quota news stayed on its
        gate, and only a wait for every route reaches the model's gate."""
        every = [*waits, reply.retry_after_s if reply.status is ReplyStatus.REJECTED else None]
        return reply.model_copy(
            update={
                "route": target.name,
                "fell_back": tuple(tried),
                "rate_limits": {},
                "retry_after_s": _earliest(every) if falls_back(reply) else None,
            }
        )

    def _unanswered(
        self,
        last: ModelReply | None,
        tried: list[str],
        waits: list[float | None],
        cancel: threading.Event | None,
        start: float,
    ) -> ModelReply:
        """No route answered: canceled, out of time, or every route passed over."""
        latency = round(max(self.clock() - start, 0.0), 6)
        if cancel is not None and cancel.is_set():
            return ModelReply(
                status=ReplyStatus.CANCELED,
                latency_s=latency,
                detail="canceled",
                fell_back=tuple(tried),
                route=None,
            )
        if last is not None:  # the deadline ran out after a fallback
            timed = ModelReply(
                status=ReplyStatus.TRANSPORT_FAILURE,
                timed_out=True,
                latency_s=latency,
                detail="the deadline ran out while falling back",
            )
            return timed.model_copy(update={"fell_back": tuple(tried)})
        if not tried:
            return ModelReply(
                status=ReplyStatus.TRANSPORT_FAILURE,
                timed_out=True,
                latency_s=latency,
                detail="the deadline passed before any route was tried",
            )
        return ModelReply(  # nothing left this worker: nothing was used
            status=ReplyStatus.REJECTED,
            usage=Usage(),
            latency_s=latency,
            retry_after_s=_earliest(waits),
            detail=f"no route of {self.model} could take the call: " + "; ".join(tried),
            fell_back=tuple(tried),
        )


def _earliest(waits: list[float | None]) -> float | None:
    """When the first route may serve again: the smallest wait, if every route gave one."""
    if not waits or any(w is None for w in waits):
        return None
    return min(w for w in waits if w is not None)
