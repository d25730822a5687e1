"""What the console's pages show, shaped from the API's views: durations, the list's filters,
the step timeline of a chain, fair-share bars. Functions of their arguments (the clock comes
in), so each is tested without a browser."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from api.problems import Problem
from api.views import Trajectory, Usage
from kernel.chain import ChainRow, RowKind
from kernel.record import ControlKind
from kernel.states import TERMINAL, LifecycleState, StopReason

E = TypeVar("E", bound=StrEnum)
#: The ages the list can be narrowed to, by the name the form sends.
AGES: dict[str, float] = {"15m": 900.0, "1h": 3600.0, "1d": 86_400.0, "7d": 604_800.0}
#: The controls a console offers (interrupt needs instructions: the CLI and the API do it).
CONTROLS: tuple[ControlKind, ...] = (
    ControlKind.PAUSE,
    ControlKind.RESUME,
    ControlKind.CANCEL,
    ControlKind.KILL,
)


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: "42 s", "4 min 05 s", "3 h 07 min", "2 d 4 h"."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86_400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86_400} d {s % 86_400 // 3600} h"


def moment(at: float) -> str:
    """An epoch time as UTC, to the second: "2026-12-01 19:48:26 UTC"."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock_time(at: float) -> str:
    """An epoch time as UTC, its time of day alone: "19:48:26"."""
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S")


def time_left(expires_at: float, now: float) -> str:
    """What is left of a hold: "4 min 05 s left", or "expired"."""
    if expires_at <= now:
        return "expired"
    return f"{duration(expires_at - now)} left"


@dataclass(frozen=True)
class Filters:
    """The trajectory list's filters, each None when not set."""

    state: LifecycleState | None = None
    stop_reason: StopReason | None = None
    agent: str | None = None
    age: str | None = None  # a key of AGES

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        """Parse the list's query; a 422 problem naming the field of a value it does not know."""
        unknown = set(query) - {"state", "stop_reason", "agent", "age"}
        if unknown:
            field = sorted(unknown)[0]
            raise Problem(
                422, "Invalid request", f"{field}: not a filter of this list", field=field
            )
        state = _member(LifecycleState, "state", query.get("state"))
        stop = _member(StopReason, "stop_reason", query.get("stop_reason"))
        age = query.get("age") or None
        if age is not None and age not in AGES:
            raise Problem(422, "Invalid request", f"age: one of {', '.join(AGES)}", field="age")
        agent = (query.get("agent") or "").strip() or None
        if agent is not None and len(agent) > 300:
            raise Problem(422, "Invalid request", "agent: at most 300 characters", field="agent")
        return cls(state, stop, agent, age)

    def keeps(self, item: Trajectory, now: float) -> bool:
        """Whether ``item`` passes every filter set (the state is the API's own query)."""
        if self.stop_reason is not None and item.stop_reason != self.stop_reason.value:
            return False
        if self.agent is not None and self.agent not in item.agent:
            return False
        return self.age is None or now - item.submitted_at <= AGES[self.age]


def _member(enum: type[E], field: str, raw: str | None) -> E | None:
    if not raw:
        return None
    try:
        return enum(raw)
    except ValueError:
        names = ", ".join(e.value for e in enum)
        raise Problem(
            422, "Invalid request", f"{field}: {raw!r} is not one of {names}", field=field
        ) from None


@dataclass(frozen=True)
class Step:
    """One line of a trajectory's timeline."""

    index: int
    kind: str  # the chain row's kind: model, tool, approval, control, stop
    title: str
    outcome: str
    detail: str
    at: float


def _args(args: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (args or {}).items())


def step_of(row: ChainRow) -> Step:
    """The timeline line of one chain row."""
    detail = dict(row.detail or {})
    if row.kind is RowKind.MODEL:
        title = f"model call, step {row.step}"
        text = f"{row.tokens_in} tokens in, {row.tokens_out} out, {row.duration_s:.2f} s"
    elif row.kind is RowKind.TOOL:
        title = f"{row.tool}({_args(row.args)})"
        text = row.error or f"{row.duration_s:.2f} s"
    elif row.kind is RowKind.APPROVAL:
        title = f"approval of {row.tool}"
        who = detail.get("reviewer")
        text = f"by {who}" if who else ""
        if detail.get("comment"):
            text += f": “{detail['comment']}”"
    elif row.kind is RowKind.CONTROL:
        title = "control"
        text = f"by {detail['by']}" if detail.get("by") else ""
    else:
        title = "stop"
        text = row.error or ""
    return Step(row.index, row.kind.value, title, row.outcome or "", text, row.at)


def controls_for(item: Trajectory, may_control: bool) -> list[tuple[ControlKind, bool]]:
    """The control buttons of a detail page and whether each is enabled: none without the
    control scope; all disabled once the run has ended."""
    if not may_control:
        return []
    ended = LifecycleState(item.state) in TERMINAL
    return [(kind, not ended) for kind in CONTROLS]


@dataclass(frozen=True)
class Share:
    """One tenant's row on the fairness page, in percent."""

    usage: Usage
    weight_pct: float
    admitted_pct: float

    @property
    def owed_pct(self) -> float | None:
        """The share the round-robin owes it now among the backlogged tenants (None when it
        has nothing queued, or when the key cannot see the other tenants)."""
        owed = self.usage.owed_share
        return None if owed is None else 100 * owed

    @property
    def gap_pct(self) -> float | None:
        """Admitted share minus what it is owed (its weight share when the key cannot see the
        others); None when it has nothing queued: it is owed no share then."""
        if not self.usage.backlogged:
            return None
        owed = self.owed_pct
        return self.admitted_pct - (self.weight_pct if owed is None else owed)


def shares(usages: list[Usage]) -> list[Share]:
    """The fairness page's rows, heaviest weight first."""
    rows = [Share(u, 100 * u.weight_share, 100 * u.admitted_share) for u in usages]
    return sorted(rows, key=lambda r: (-r.usage.weight, r.usage.tenant))
