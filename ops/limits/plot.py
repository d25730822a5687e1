"""Pictures for ``reins limits``: an SVG or PNG by matplotlib (the optional ``plot`` extra) and
a compact rendering for the terminal.

Per dimension, two panels: the distribution of accepted runs with the candidate caps marked,
and the cost per accepted task against the cap with its standard error as error bars.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernel.errors import InvalidInput
from ops.limits.stats import Dim, DimensionReport

BAR = 28  # characters of the longest terminal bar
_STABLE = {".svg": {"Date": None}, ".png": {}}  # no timestamp: the same figures, the same file


def terminal_lines(dim: str, caps: Sequence[Mapping[str, Any]], unit: str = "") -> list[str]:
    """Cost per accepted task per cap as bars, the error as ``±``, ties marked ``~``."""
    priced = [c for c in caps if c.get("cost_per_accepted") is not None]
    if not priced:
        return [f"{dim}: no cap accepts any run"]
    top = max(float(c["cost_per_accepted"]) for c in priced)
    lines = [f"{dim}: cost per accepted task by cap ('~' within the error of the lowest)"]
    for c in caps:
        cost = c.get("cost_per_accepted")
        label = f"{c['cap']:>8g}"
        if cost is None:
            lines.append(f"{label} | (nothing accepted)")
            continue
        err = float(cost) * float(c.get("rse") or 0.0)
        bar = "█" * max(1, round(BAR * float(cost) / top)) if top > 0 else ""
        tie = "~" if c.get("tie_with_best") else " "
        lines.append(f"{label} |{bar:<{BAR}} {tie}{unit}{float(cost):.4g} ± {err:.2g}")
    return lines


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        matplotlib.rcParams["svg.hashsalt"] = "reins"  # stable element ids
        import matplotlib.pyplot as plt
    except ImportError:
        raise InvalidInput(
            "pictures need matplotlib: pip install 'reins[plot]' (or drop --plot)"
        ) from None
    return plt


def write_picture(
    path: Path,
    reports: Mapping[Dim, DimensionReport],
    values: Mapping[Dim, Sequence[float]],
    title: str,
) -> Path:
    """Two panels per dimension that has caps: the accepted runs' distribution with the caps
    marked, and cost per accepted task against the cap with error bars. SVG or PNG by the
    suffix of ``path``."""
    if path.suffix not in {".svg", ".png"}:
        raise InvalidInput(f"--plot {path}: the picture must be a .svg or a .png file")
    dims = [d for d, r in reports.items() if r.caps]
    if not dims:
        raise InvalidInput("--plot needs candidate caps (--caps) to draw")
    plt = _pyplot()
    fig, axes = plt.subplots(len(dims), 2, figsize=(10, 3.4 * len(dims)), squeeze=False)
    for row, dim in enumerate(dims):
        rep = reports[dim]
        hist, curve = axes[row]
        accepted = list(values.get(dim, ()))
        if accepted:
            hist.hist(accepted, bins=min(30, max(5, len(set(accepted)))), color="#4C72B0")
        for c in rep.caps:
            hist.axvline(c.cap, color="#C44E52", linestyle="--", linewidth=1)
        hist.set_title(f"{dim.value}: accepted runs, caps dashed")
        hist.set_xlabel(dim.value)
        hist.set_ylabel("runs")
        priced = [c for c in rep.caps if c.cost_per_accepted is not None]
        xs = [c.cap for c in priced]
        ys = [c.cost_per_accepted or 0.0 for c in priced]
        errs = [(c.cost_per_accepted or 0.0) * (c.rse or 0.0) for c in priced]
        curve.errorbar(xs, ys, yerr=errs, marker="o", capsize=4, color="#55A868")
        curve.set_title(f"{dim.value}: cost per accepted task (± 1 s.e.)")
        curve.set_xlabel(f"cap ({dim.value})")
        curve.set_ylabel(f"{dim.value} per accepted task")
    return _save(plt, fig, path, title)


def write_trial_picture(path: Path, rows: Sequence[Mapping[str, Any]], title: str) -> Path:
    """Per trial dimension: dollars per accepted task against the cap with error bars, and the
    acceptance fraction on a second axis."""
    if path.suffix not in {".svg", ".png"}:
        raise InvalidInput(f"--plot {path}: the picture must be a .svg or a .png file")
    dims = list(dict.fromkeys(str(r["dimension"]) for r in rows))
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(dims), figsize=(7 * len(dims), 4.5), squeeze=False)
    for ax, dim in zip(axes[0], dims, strict=True):
        group = [r for r in rows if r["dimension"] == dim]
        priced = [r for r in group if r["cost_per_accepted"] is not None]
        ax.errorbar(
            [r["cap"] for r in priced],
            [r["cost_per_accepted"] for r in priced],
            yerr=[r["cost_per_accepted"] * (r["rse"] or 0.0) for r in priced],
            marker="o",
            capsize=4,
            color="#55A868",
            label="$ per accepted task (± 1 s.e.)",
        )
        ax.set_xlabel(f"cap ({dim})")
        ax.set_ylabel("dollars per accepted task")
        share = ax.twinx()
        share.plot(
            [r["cap"] for r in group],
            [r["acceptance"] for r in group],
            marker="s",
            linestyle=":",
            color="#4C72B0",
            label="acceptance",
        )
        share.set_ylabel("acceptance fraction")
        share.set_ylim(0, 1.05)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dim}: measured as a policy")
        handles = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="lower right", fontsize="small")
    return _save(plt, fig, path, title)


def _save(plt: Any, fig: Any, path: Path, title: str) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata=_STABLE.get(path.suffix))
    plt.close(fig)
    return path
