"""Notices: how a turn ended, or why a trajectory is READY, as the feed carries them.

A notice is a hint, never the truth: a router re-reads the record before acting on it. It is
stored as a JSON object of its fields by name, with ``format`` (:data:`NOTICE_FORMAT`); a field
at its default is left out. Format 1, an earlier build's, is a JSON array of the fields in
their order, the trailing defaults left out; it still decodes, so the notices an older worker
wrote during a rolling upgrade are acted on (upgrade routers first: an older router does not
read format 2). Design: ``docs/adr/0006-fleet-wire.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import orjson

from kernel.context import KernelContext
from kernel.errors import InvalidInput
from kernel.record import TrajectoryRecord
from kernel.render import estimate_tokens, render
from router.admission.claims import ReturningCall

#: The notice format this build writes; it reads this one and format 1.
NOTICE_FORMAT = 2


class NoticeKind(StrEnum):
    """How a turn ended, or why a trajectory is READY."""

    READY = "ready"  # READY: put it in its tenant's queue
    HELD = "held"  # AWAITING_APPROVAL: it holds no worker until a decision
    FINISHED = "finished"  # the run ended
    IDLE = "idle"  # the turn ended without a queue entry (paused, ignored, stale)


@dataclass(frozen=True, slots=True)
class Notice:
    """One entry of the feed's notices (module docstring)."""

    kind: NoticeKind
    tenant: str
    trajectory_id: str
    version: int
    call_id: str = ""  # the model call whose turn ended ("" for a submission)
    input_tokens: int = 0  # the next call's charge, for READY notices
    output_allowance: int = 1
    at: float = 0.0
    route: str = ""  # the provider route (provider/model) of the next call, for READY
    lease: str = ""  # the gate lease the ended turn was admitted under: its claim id ("" none)
    lease_route: str = ""  # the gate route of that lease
    used_tokens: int = -1  # the ended turn's model usage in tokens; -1: no evidence
    service_class: str = ""  # the record's service class, for READY ("": the tenant's first)
    retry_after_s: float = -1.0  # the ended turn's reply: seconds to wait (-1: it said nothing)
    rate_limits: dict[str, str] = field(default_factory=dict, hash=False)  # and its headers

    @property
    def feedback(self) -> bool:
        """True when the ended turn's reply said something about the provider's quota."""
        return self.retry_after_s >= 0 or bool(self.rate_limits)

    def returning(self, route: str | None) -> ReturningCall:
        """What the admitter queues back for this READY trajectory: its next call through the
        gate ``route`` (None: no gate governs it), in the record's service class."""
        tokens, allowance = max(self.input_tokens, 0), max(self.output_allowance, 1)
        klass = self.service_class or None
        return ReturningCall(self.tenant, self.trajectory_id, tokens, allowance, klass, route)

    def encode(self) -> bytes:
        """The JSON object kept in Redis: ``format``, the kind, and every field not at its
        default, by name."""
        body: dict[str, Any] = {
            "format": NOTICE_FORMAT,
            "kind": self.kind.value,
            "tenant": self.tenant,
            "trajectory_id": self.trajectory_id,
            "version": self.version,
        }
        for name, default in _DEFAULTS:
            value = getattr(self, name)
            if value != default:
                body[name] = value
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes | str) -> Notice:
        """Parse a stored notice of format 2 or 1; raise :class:`InvalidInput` for anything
        malformed (a field this build does not know, or of the wrong type, included: a notice
        that would fail later, in the router's loop, must fail here)."""
        try:
            body = orjson.loads(raw)
            if isinstance(body, list):
                body = _positional(body)
            elif not isinstance(body, dict) or body.pop("format", None) != NOTICE_FORMAT:
                raise TypeError(f"not a notice of format 1 or {NOTICE_FORMAT}")
            kind = NoticeKind(body.pop("kind"))
            _check(body)
            return cls(kind, **body)
        except (ValueError, TypeError, KeyError) as exc:  # orjson's JSONDecodeError is one
            raise InvalidInput(f"malformed notice: {exc}") from None


#: The fields after the kind (format 1's order); those every notice has; the others' defaults.
_FIELDS = [f for f in fields(Notice) if f.name != "kind"]
_REQUIRED = ("tenant", "trajectory_id", "version")
_DEFAULTS = [
    (f.name, {} if f.name == "rate_limits" else f.default)
    for f in _FIELDS
    if f.name not in _REQUIRED
]
_TYPES: dict[str, type | tuple[type, ...]] = {
    "tenant": str,
    "trajectory_id": str,
    "version": int,
    "call_id": str,
    "input_tokens": int,
    "output_allowance": int,
    "at": (int, float),
    "route": str,
    "lease": str,
    "lease_route": str,
    "used_tokens": int,
    "service_class": str,
    "retry_after_s": (int, float),
    "rate_limits": dict,
}


def _positional(values: list[Any]) -> dict[str, Any]:
    """The fields of a format-1 notice (an array: the kind, then the fields in order)."""
    kind, *rest = values
    if len(rest) > len(_FIELDS):
        raise TypeError(f"{len(rest)} fields after the kind; format 1 has {len(_FIELDS)}")
    return {"kind": kind, **{f.name: value for f, value in zip(_FIELDS, rest, strict=False)}}


def _check(body: dict[str, Any]) -> None:
    """Raise TypeError naming the first field this build does not know, lacks or cannot use."""
    for name in _REQUIRED:
        if name not in body:
            raise TypeError(f"{name} is missing")
    for name, value in body.items():
        types = _TYPES.get(name)
        if types is None:
            raise TypeError(f"{name} is not a field this build knows")
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise TypeError(f"{name} is a {type(value).__name__}")
    headers = body.get("rate_limits", {})
    if not all(isinstance(v, str) for v in headers.values()):
        raise TypeError("rate_limits must map header names to strings")


def call_input(rec: TrajectoryRecord, ctx: KernelContext | None) -> int:
    """The input tokens ``rec``'s next model call pre-debits at its gate: what the kernel will
    reserve for it (the view's estimate, the model's margin, its framing and the tool schemas
    it is sent), so the gate admits no more than the provider counts. Without the agent's
    context (it cannot be loaded here), the view's estimate alone."""
    view = render(rec)
    if ctx is None:
        return estimate_tokens(view)
    return ctx.reserved_input(ctx.estimator(view))


def ready_notice(
    rec: TrajectoryRecord,
    call_id: str,
    now: float,
    route: str = "",
    ctx: KernelContext | None = None,
) -> Notice:
    """The READY notice of ``rec``: its next call's charge is :func:`call_input` plus its
    output cap."""
    return Notice(
        NoticeKind.READY,
        rec.tenant,
        rec.trajectory_id,
        rec.record_version,
        call_id,
        call_input(rec, ctx),
        rec.budget.max_output_tokens,
        now,
        route,
        service_class=rec.service_class or "",
    )
