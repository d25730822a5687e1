"""The fairness page's chart of shares over time, drawn by the server as SVG: one line per
tenant through its admitted share in each span of time, and its weight share as a dashed line
at the height it would have were every tenant backlogged. Spans in which nothing was admitted
break the lines. Functions of their arguments, so the geometry is tested without a browser."""

from __future__ import annotations

from dataclasses import dataclass

from api.views import UsageHistory

WIDTH, HEIGHT = 640.0, 200.0  # the SVG's viewBox: x over time, y from 100 % (top) to 0
PAD = 8.0  # above 100 % and below 0 %, so that dots there are drawn whole
LINES = 8  # the most tenants drawn (the heaviest); the table below lists the same
#: Line colours, each at least 4.5:1 on white (they double as the legend's text colour).
COLOURS = ("#0b57d0", "#a3161a", "#146c2e", "#7a4b00", "#6b2fa0", "#00607a", "#8a1c5c", "#3d4a5c")


@dataclass(frozen=True)
class TenantLine:
    """One tenant's line: its colour, its polylines' points ("x,y x,y ..."), the y of its
    weight share, and its share in each span (None where nothing was admitted)."""

    tenant: str
    colour: str
    segments: tuple[str, ...]
    weight_y: float
    shares: tuple[float | None, ...]


@dataclass(frozen=True)
class Chart:
    """The chart: a line per tenant, the spans' times and contention, and how many tenants
    were left out (past :data:`LINES`)."""

    lines: tuple[TenantLine, ...]
    starts: tuple[float, ...]
    ends: tuple[float, ...]
    admissions: tuple[int, ...]
    contended: tuple[float | None, ...]
    left_out: int


def y_of(share: float) -> float:
    """The y of a share (0 to 1) in the viewBox: 100 % at ``PAD``, 0 at ``HEIGHT - PAD``."""
    return round(PAD + (HEIGHT - 2 * PAD) * (1.0 - min(max(share, 0.0), 1.0)), 1)


def chart(history: UsageHistory, weights: dict[str, float]) -> Chart:
    """The chart of ``history``, tenants by ``weights`` (tenant -> weight share), heaviest
    first; each span's point at its middle."""
    spans = history.buckets
    drawn = sorted(history.tenants, key=lambda t: (-weights.get(t, 0.0), t))[:LINES]
    step = WIDTH / max(len(spans), 1)
    lines = []
    for n, tenant in enumerate(drawn):
        shares = tuple(b.shares.get(tenant) if b.admissions else None for b in spans)
        segments: list[str] = []
        run: list[str] = []
        for i, share in enumerate(shares):
            if share is None:
                segments += [" ".join(run)] if run else []
                run = []
                continue
            run.append(f"{round(step * (i + 0.5), 1)},{y_of(share)}")
        segments += [" ".join(run)] if run else []
        lines.append(
            TenantLine(
                tenant=tenant,
                colour=COLOURS[n % len(COLOURS)],
                segments=tuple(segments),
                weight_y=y_of(weights.get(tenant, 0.0)),
                shares=shares,
            )
        )
    return Chart(
        lines=tuple(lines),
        starts=tuple(b.start for b in spans),
        ends=tuple(b.end for b in spans),
        admissions=tuple(b.admissions for b in spans),
        contended=tuple(b.contended for b in spans),
        left_out=len(history.tenants) - len(drawn),
    )
