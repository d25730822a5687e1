"""Choosing limits from evidence: the arithmetic of ``reins limits`` (seed 000 "Choosing
limits", seed 004 section 10.9.5 and its exercise "Choosing a ceiling from a trial").

Pure functions over :class:`RunOutcome` rows, one per finished trajectory. Two questions:

* where do accepted runs sit in a dimension? The percentiles of accepted runs by the seed's
  index rule (``runs[int(f * (n - 1))]``) and the share of them a candidate cap would cut off;
* what does a cap cost? Under the seed's binding rule a run accepted at or below the cap keeps
  its outcome and its spend, and every other run is not accepted and spends what it spent, at
  most the cap. Cost per accepted task is the total spend of all runs over the accepted count
  (equation 1.2); its relative standard error treats acceptance as binomial with the total
  frozen, to first order ``sqrt((1 - p) / (p n))``.

Read off a generous run, these are post-hoc estimates: a policy that steers or compacts near its
cap changes what happens below it, so it must be tried as a policy (``reins limits trial``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from kernel.errors import InvalidInput

#: The percentiles the report shows, by name.
PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
#: A gap between two caps' costs within this many combined standard errors is a tie.
TIE_SIGMAS = 2.0
POST_HOC = (
    "post-hoc estimates from finished runs: a run accepted at or below a cap keeps its outcome, "
    "every other run spends at most the cap and is not accepted; a policy that steers or "
    "compacts near its cap must be tried as a policy (reins limits trial)"
)


class Dim(StrEnum):
    """A budget dimension the report reads, named as in the JSON output."""

    STEPS = "steps"
    TOOL_CALLS = "tool_calls"
    TOKENS = "tokens"
    DOLLARS = "dollars"
    ACTIVE_S = "active_s"


#: The input column of each dimension (a CSV says ``cost_usd`` for dollars).
COLUMNS = {
    Dim.STEPS: "steps",
    Dim.TOOL_CALLS: "tool_calls",
    Dim.TOKENS: "tokens",
    Dim.DOLLARS: "cost_usd",
    Dim.ACTIVE_S: "active_s",
}
#: What ``--caps NAME=...`` may name: the dimension's own name or its input column.
DIM_NAMES = {**{d.value: d for d in Dim}, **{c: d for d, c in COLUMNS.items()}}


@dataclass(frozen=True)
class RunOutcome:
    """One finished trajectory: whether it was accepted and what it spent per dimension (a
    dimension the source did not record is absent)."""

    trajectory_id: str
    accepted: bool
    spend: Mapping[Dim, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CapFigures:
    """What one candidate cap would have given."""

    cap: float
    cut_off_fraction: float | None  # of accepted runs, the share above the cap
    accepted: int
    total: float  # the spend of all runs under the cap, in the dimension's unit
    cost_per_accepted: float | None
    rse: float | None  # relative standard error of cost_per_accepted
    tasks_for_target_rse: int | None
    tie_with_best: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "cap": self.cap,
            "cut_off_fraction": _round(self.cut_off_fraction),
            "accepted": self.accepted,
            "total": _round(self.total),
            "cost_per_accepted": _round(self.cost_per_accepted),
            "rse": _round(self.rse),
            "tasks_for_target_rse": self.tasks_for_target_rse,
            "tie_with_best": self.tie_with_best,
        }


@dataclass(frozen=True)
class DimensionReport:
    """One dimension: where accepted runs sit, and each candidate cap."""

    dim: Dim
    runs: int
    accepted: int
    percentiles: dict[str, float]
    caps: list[CapFigures]

    def as_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "accepted": self.accepted,
            "percentiles": {k: _round(v) for k, v in self.percentiles.items()},
            "caps": [c.as_json() for c in self.caps],
            "tasks_for_target_rse": {
                _cap_key(c.cap): c.tasks_for_target_rse
                for c in self.caps
                if c.tasks_for_target_rse is not None
            },
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _cap_key(cap: float) -> str:
    return f"{cap:g}"


def quantile(sorted_values: Sequence[float], f: float) -> float:
    """The seed's index rule: ``runs[int(f * (n - 1))]`` over values sorted ascending."""
    if not sorted_values:
        raise InvalidInput("no accepted runs to take a percentile of")
    return sorted_values[int(f * (len(sorted_values) - 1))]


def relative_standard_error(accepted: int, n: int) -> float | None:
    """First-order relative standard error of cost per accepted task with the total frozen:
    the binomial standard error of the acceptance fraction over the fraction itself."""
    if accepted <= 0 or n <= 0:
        return None
    p = accepted / n
    return math.sqrt((1.0 - p) / (p * n))


def tasks_for_rse(accepted: int, n: int, target: float) -> int | None:
    """How many tasks bring the relative standard error to ``target`` at this acceptance."""
    if accepted <= 0 or n <= 0 or target <= 0:
        return None
    p = accepted / n
    return math.ceil((1.0 - p) / (p * target * target) - 1e-9)


def cap_figures(
    outcomes: Sequence[RunOutcome], dim: Dim, cap: float, target_rse: float | None
) -> CapFigures:
    """One cap under the binding rule (module docstring)."""
    rows = [o for o in outcomes if dim in o.spend]
    accepted_values = [o.spend[dim] for o in rows if o.accepted]
    accepted, total = 0, 0.0
    for o in rows:
        value = o.spend[dim]
        if o.accepted and value <= cap:
            accepted += 1
            total += value
        else:
            total += min(value, cap)
    cut = sum(v > cap for v in accepted_values) / len(accepted_values) if accepted_values else None
    return CapFigures(
        cap=cap,
        cut_off_fraction=cut,
        accepted=accepted,
        total=total,
        cost_per_accepted=total / accepted if accepted else None,
        rse=relative_standard_error(accepted, len(rows)),
        tasks_for_target_rse=(
            tasks_for_rse(accepted, len(rows), target_rse) if target_rse is not None else None
        ),
    )


def mark_ties(caps: list[CapFigures]) -> list[CapFigures]:
    """Flag the caps whose cost per accepted task is within :data:`TIE_SIGMAS` combined
    standard errors of the lowest one (the lowest included): their difference is not
    established by these figures, and the simpler policy is preferred."""
    priced = [c for c in caps if c.cost_per_accepted is not None and c.rse is not None]
    if not priced:
        return caps
    best = min(priced, key=lambda c: c.cost_per_accepted or 0.0)
    assert best.cost_per_accepted is not None and best.rse is not None
    best_se = best.cost_per_accepted * best.rse
    out = []
    for c in caps:
        tie = False
        if c.cost_per_accepted is not None and c.rse is not None:
            se = math.hypot(c.cost_per_accepted * c.rse, best_se)
            tie = c.cost_per_accepted - best.cost_per_accepted <= TIE_SIGMAS * se
        out.append(replace(c, tie_with_best=tie))
    return out


def dimension_report(
    outcomes: Sequence[RunOutcome], dim: Dim, caps: Iterable[float], target_rse: float | None
) -> DimensionReport:
    """Percentiles of accepted runs and the figures of each candidate cap, ascending."""
    rows = [o for o in outcomes if dim in o.spend]
    values = sorted(o.spend[dim] for o in rows if o.accepted)
    percentiles: dict[str, float] = {}
    if values:
        percentiles = {name: quantile(values, f) for name, f in PERCENTILES.items()}
        percentiles["max"] = values[-1]
    figures = [cap_figures(rows, dim, c, target_rse) for c in sorted(set(caps))]
    return DimensionReport(dim, len(rows), len(values), percentiles, mark_ties(figures))


def report(
    outcomes: Sequence[RunOutcome],
    caps: Mapping[Dim, Sequence[float]],
    target_rse: float | None = None,
) -> dict[Dim, DimensionReport]:
    """Every dimension the outcomes record (or that has candidate caps), in a fixed order."""
    if not outcomes:
        raise InvalidInput("no finished runs to report on: check the source and its filters")
    recorded = {d for o in outcomes for d in o.spend}
    missing = sorted(d.value for d in caps if d not in recorded)
    if missing:
        raise InvalidInput(
            f"caps given for {', '.join(missing)}, which no run records: "
            f"recorded are {', '.join(sorted(d.value for d in recorded)) or 'none'}"
        )
    return {
        d: dimension_report(outcomes, d, caps.get(d, ()), target_rse) for d in Dim if d in recorded
    }


def parse_caps(specs: Iterable[str]) -> dict[Dim, list[float]]:
    """``steps=4,6,8`` (repeatable) into candidate caps per dimension; bad specs raise
    :class:`InvalidInput` naming the spec."""
    caps: dict[Dim, list[float]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        dim = DIM_NAMES.get(name.strip())
        if not sep or dim is None:
            raise InvalidInput(
                f"--caps {spec!r}: expected NAME=V1,V2,... with NAME one of "
                f"{', '.join(d.value for d in Dim)}"
            )
        try:
            parsed = [float(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise InvalidInput(f"--caps {spec!r}: the caps must be numbers") from None
        if not parsed or any(not math.isfinite(v) or v <= 0 for v in parsed):
            raise InvalidInput(f"--caps {spec!r}: give one or more positive numbers")
        caps.setdefault(dim, []).extend(parsed)
    return caps
