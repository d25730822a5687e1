"""Provider quota gates: requests and tokens per window, and concurrency as expiring leases.

One gate per route (``provider/model``). A debit takes one request, the call's full input plus
output allowance, and a concurrency lease; it counts against the window until one window after its
settlement (lease expiry while in flight), and the holder renews the lease while the call runs. A
call the gate refuses stays READY. Provider feedback (:meth:`ProviderGates.observe`) only ever
narrows the headroom. :class:`ProviderGates` states the contract; :class:`MemoryGates` implements it
in one process, :class:`router.admission.redis.gates.RedisGates` for every router replica. Design:
``docs/adr/0004-provider-gates.md``.
"""

from __future__ import annotations

import abc
import heapq
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kernel.errors import ConfigError
from router.admission.drr import ReadyCall
from router.admission.feedback import Feedback, feedback_from

Clock = Callable[[], float]
#: A gate route: ``provider/model``; it ends up in Redis keys, so no braces, spaces or quotes.
ROUTE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
__all__ = ["Feedback", "GateConfig", "GateReading", "MemoryGates", "ProviderGates", "feedback_from"]


class GateSettlement(NamedTuple):
    """What a turn that ended settles of its gate lease: the route, the lease id and the tokens
    its model call used (-1: no evidence)."""

    route: str
    lease: str
    used_tokens: int


#: A turn that settles no lease.
NO_SETTLEMENT = GateSettlement("", "", -1)


class ProviderLimits(BaseModel):
    """The limits of one route; ``None`` means that dimension is not limited."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rpm: int | None = Field(None, ge=1, description="requests per window")
    tpm: int | None = Field(None, ge=1, description="tokens (input + max output) per window")
    concurrency: int | None = Field(None, ge=1, description="requests in flight")
    window_s: float = Field(60.0, gt=0, description="length of the rate window")
    lease_ttl_s: float = Field(30.0, gt=0, description="a lease lapses unless renewed this often")
    safety_fraction: float = Field(0.0, ge=0, lt=1, description="share of rpm/tpm held back")

    def effective(self) -> tuple[int, int, int]:
        """(rpm, tpm, concurrency) as enforced: the safety share held back, -1 for no limit."""
        keep = 1.0 - self.safety_fraction

        def cut(limit: int | None) -> int:
            return -1 if limit is None else max(1, math.floor(limit * keep))

        return cut(self.rpm), cut(self.tpm), -1 if self.concurrency is None else self.concurrency


class GateConfig(BaseModel):
    """Every route's limits, validated once at the edge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    routes: dict[str, ProviderLimits]

    @model_validator(mode="after")
    def _names(self) -> GateConfig:
        bad = [r for r in self.routes if not ROUTE_RE.match(r)]
        if bad:
            raise ConfigError(f"gate routes {bad} must match {ROUTE_RE.pattern}")
        return self

    @classmethod
    def from_mapping(cls, data: Mapping[str, object]) -> GateConfig:
        """Validate ``{"routes": {"openai/gpt-4o": {"rpm": 500, ...}}}``; ConfigError otherwise."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"gate configuration: {where}: {first['msg']}") from None


@dataclass(frozen=True, slots=True)
class GateReading:
    """A gate's counters as of one operation, after it (before it, for a refused debit)."""

    route: str
    ok: bool
    reason: str  # "ok", "repeat", "paused", "rpm", "tpm", "concurrency", "remaining_tokens", ...
    requests: int
    tokens: int
    leases: int
    rpm: int  # -1: not limited
    tpm: int
    concurrency: int
    paused_until: float = 0.0
    remaining_requests: int = -1  # what the provider last said remains (-1: nothing said)
    remaining_tokens: int = -1
    remaining_until: float = 0.0

    def holds_back(self, now: float) -> str | None:
        """Why a new call would wait at this gate now (``paused``, ``concurrency``, ``rpm``,
        ``tpm``), or None when it has room (or is no gate: a route never configured)."""
        if self.reason == "unknown_route":
            return None
        if self.paused_until > now:
            return "paused"
        for why, count, limit in (
            ("concurrency", self.leases, self.concurrency),
            ("rpm", self.requests, self.rpm),
            ("tpm", self.tokens, self.tpm),
        ):
            if 0 <= limit <= count:
                return why
        return None

    def within_limits(self) -> bool:
        """True when no counter is above its limit."""
        return all(
            limit < 0 or count <= limit
            for count, limit in (
                (self.requests, self.rpm),
                (self.tokens, self.tpm),
                (self.leases, self.concurrency),
            )
        )


class ProviderGates(abc.ABC):
    """The quota gates of every configured route.

    Contract, for every implementation: each operation is atomic with every other on the same
    route (two routers never both take the last unit of quota); a refused :meth:`debit` changes
    nothing; a debit counts against rpm and tpm from when it is made until ``window_s`` after its
    settlement (lease expiry while in flight) and holds one concurrency lease until settled,
    released or expired; no counter ever exceeds its limit because of a debit (a settlement
    that reports more tokens than debited can, since the provider already counted them). Lease
    ids are the caller's: one per dispatched request (the admitter uses its claim id).
    """

    @abc.abstractmethod
    def debit(self, route: str, lease_id: str, tokens: int) -> GateReading:
        """Debit one request of ``tokens`` and take a lease, or refuse (``ok`` False)."""

    @abc.abstractmethod
    def renew(self, route: str, lease_id: str) -> bool:
        """Extend a live lease by its ttl; False if it already lapsed (stop: do not send)."""

    @abc.abstractmethod
    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> GateReading:
        """Release the lease; correct the debit to ``used_tokens`` (None: no evidence, keep it)."""

    @abc.abstractmethod
    def release(self, route: str, lease_id: str) -> GateReading:
        """Undo a debit whose request never left (refunds its request and tokens)."""

    @abc.abstractmethod
    def observe(self, route: str, feedback: Feedback) -> GateReading:
        """Apply what a reply said: pause for retry-after, cap headroom by remaining quota."""

    @abc.abstractmethod
    def reading(self, route: str) -> GateReading:
        """The route's counters as of now."""

    def after_reply(
        self,
        route: str,
        lease_id: str,
        *,
        used_tokens: int | None,
        rate_limits: Mapping[str, str],
        retry_after_s: float | None,
        now_wall: float,
    ) -> GateReading:
        """Settle a finished call and apply its feedback, before anyone waits on a retry."""
        self.settle(route, lease_id, used_tokens)
        return self.observe(route, feedback_from(rate_limits, retry_after_s, now_wall))


@dataclass(slots=True)
class _Route:
    rpm: int
    tpm: int
    concurrency: int
    window_s: float
    ttl_s: float
    counts_until: dict[str, float] = field(default_factory=dict)  # lease -> end of its count
    amount: dict[str, int] = field(default_factory=dict)
    heap: list[tuple[float, str]] = field(default_factory=list)  # lazy: stale entries skipped
    tokens: int = 0
    leases: dict[str, float] = field(default_factory=dict)  # lease -> expiry
    paused_until: float = 0.0
    remaining_requests: int = -1
    remaining_tokens: int = -1
    remaining_until: float = 0.0


class MemoryGates(ProviderGates):
    """The gates in one process, behind one lock: the embedded runner's, and the reference.

    With the in-memory :class:`~router.admission.local.Admitter`, :meth:`check` is the admission
    check (``admitter.admit_next(gates.check)``); the admitted call's lease is :meth:`lease_of`.
    """

    def __init__(self, config: GateConfig, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._routes: dict[str, _Route] = {}
        for name, limits in config.routes.items():
            rpm, tpm, conc = limits.effective()
            self._routes[name] = _Route(rpm, tpm, conc, limits.window_s, limits.lease_ttl_s)
        self._leases: dict[str, str] = {}
        self._serial = 0

    def check(self, call: ReadyCall) -> bool:
        """Debit the call's route under a fresh lease; True if it passed (no route: True)."""
        if not call.route:
            return True
        self._serial += 1
        lease = f"{call.trajectory_id}#{self._serial}"
        if self.debit(call.route, lease, call.charge).ok:
            self._leases[call.trajectory_id] = lease
            return True
        return False

    def lease_of(self, trajectory_id: str) -> str | None:
        """The lease :meth:`check` took for the trajectory's last admitted call."""
        return self._leases.get(trajectory_id)

    def debit(self, route: str, lease_id: str, tokens: int) -> GateReading:
        with self._lock:
            r, now = self._route(route), self._clock()
            if r is None:
                return _unknown(route)
            self._trim(r, now)
            if lease_id in r.leases and lease_id in r.counts_until:
                return self._read(route, r, True, "repeat")
            self._drop(r, lease_id)
            why = self._refusal(r, tokens, now)
            if why:
                return self._read(route, r, False, why)
            if now < r.remaining_until:
                r.remaining_requests -= 1 if r.remaining_requests >= 0 else 0
                r.remaining_tokens -= tokens if r.remaining_tokens >= 0 else 0
            self._count(r, lease_id, now + r.ttl_s + r.window_s)
            r.amount[lease_id] = tokens
            r.tokens += tokens
            r.leases[lease_id] = now + r.ttl_s
            return self._read(route, r, True, "ok")

    def renew(self, route: str, lease_id: str) -> bool:
        with self._lock:
            r, now = self._route(route), self._clock()
            if r is None or r.leases.get(lease_id, -math.inf) <= now:
                return False
            r.leases[lease_id] = now + r.ttl_s
            if lease_id in r.counts_until:
                self._count(r, lease_id, now + r.ttl_s + r.window_s)
            return True

    def settle(self, route: str, lease_id: str, used_tokens: int | None) -> GateReading:
        with self._lock:
            r, now = self._route(route), self._clock()
            if r is None:
                return _unknown(route)
            r.leases.pop(lease_id, None)
            ok = lease_id in r.counts_until
            if ok:
                if used_tokens is not None:
                    r.tokens += used_tokens - r.amount[lease_id]
                    r.amount[lease_id] = used_tokens
                self._count(r, lease_id, now + r.window_s)
            self._trim(r, now)
            return self._read(route, r, ok, "ok" if ok else "not_debited")

    def release(self, route: str, lease_id: str) -> GateReading:
        with self._lock:
            r, now = self._route(route), self._clock()
            if r is None:
                return _unknown(route)
            ok = self._drop(r, lease_id)
            self._trim(r, now)
            return self._read(route, r, ok, "ok" if ok else "not_debited")

    def observe(self, route: str, feedback: Feedback) -> GateReading:
        with self._lock:
            r, now = self._route(route), self._clock()
            if r is None:
                return _unknown(route)
            if feedback.retry_after_s is not None:
                r.paused_until = max(r.paused_until, now + max(feedback.retry_after_s, 0.0))
            if feedback.remaining_requests >= 0 or feedback.remaining_tokens >= 0:
                reset = r.window_s if feedback.reset_s is None else feedback.reset_s
                r.remaining_until = now + reset
                r.remaining_requests = feedback.remaining_requests
                r.remaining_tokens = feedback.remaining_tokens
            self._trim(r, now)
            return self._read(route, r, True, "ok")

    def reading(self, route: str) -> GateReading:
        with self._lock:
            r = self._route(route)
            if r is None:
                return _unknown(route)
            self._trim(r, self._clock())
            return self._read(route, r, True, "ok")

    # --- internals ------------------------------------------------------------------------

    def _route(self, route: str) -> _Route | None:
        return self._routes.get(route)

    @staticmethod
    def _refusal(r: _Route, tokens: int, now: float) -> str:
        if now < r.paused_until:
            return "paused"
        if r.rpm >= 0 and len(r.counts_until) + 1 > r.rpm:
            return "rpm"
        if r.tpm >= 0 and r.tokens + tokens > r.tpm:
            return "tpm"
        if r.concurrency >= 0 and len(r.leases) + 1 > r.concurrency:
            return "concurrency"
        if now < r.remaining_until:
            if 0 <= r.remaining_requests < 1:
                return "remaining_requests"
            if 0 <= r.remaining_tokens < tokens:
                return "remaining_tokens"
        return ""

    @staticmethod
    def _count(r: _Route, lease_id: str, until: float) -> None:
        r.counts_until[lease_id] = until
        heapq.heappush(r.heap, (until, lease_id))

    @staticmethod
    def _drop(r: _Route, lease_id: str) -> bool:
        r.leases.pop(lease_id, None)
        if r.counts_until.pop(lease_id, None) is None:
            return False
        r.tokens -= r.amount.pop(lease_id)
        return True

    def _trim(self, r: _Route, now: float) -> None:
        heap = r.heap
        while heap and heap[0][0] <= now:
            until, lease = heapq.heappop(heap)
            if r.counts_until.get(lease) == until:
                del r.counts_until[lease]
                r.tokens -= r.amount.pop(lease)
        for lease in [k for k, v in r.leases.items() if v <= now]:
            del r.leases[lease]

    @staticmethod
    def _read(route: str, r: _Route, ok: bool, reason: str) -> GateReading:
        return GateReading(
            route,
            ok,
            reason,
            len(r.counts_until),
            r.tokens,
            len(r.leases),
            r.rpm,
            r.tpm,
            r.concurrency,
            r.paused_until,
            r.remaining_requests,
            r.remaining_tokens,
            r.remaining_until,
        )


def _unknown(route: str) -> GateReading:
    return GateReading(route, False, "unknown_route", 0, 0, 0, -1, -1, -1)
