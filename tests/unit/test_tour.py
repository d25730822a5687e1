"""The README's tour names every runtime module, in the folder it sits in, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("kernel", "store", "router", "worker", "api", "ops")
CONTINUATION = 15  # a line indented this far continues the description above it


def tour_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = text.split("## Tour", 1)[1]
    return tour.split("```", 2)[1].splitlines()


def toured_modules(lines: list[str]) -> set[str]:
    """Each ``name.py`` in the tour, as a path under the folder the tour names it in."""
    folders: list[tuple[int, str]] = []  # (indent, path) from the top folder down
    named: set[str] = set()
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if indent < CONTINUATION:
            while folders and folders[-1][0] >= indent:
                folders.pop()
        if indent < CONTINUATION and re.fullmatch(r"[a-z_]+/", first):
            parent = folders[-1][1] if folders else ""
            folders.append((indent, parent + first))
            line = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
        if not folders:
            continue
        for name in re.findall(r"(?<![\w/.])([a-z_0-9]+\.py)\b", line):
            named.add(folders[-1][1] + name)
    return {n for n in named if n.split("/")[0] in RUNTIME}


def runtime_modules() -> set[str]:
    found = set()
    for package in RUNTIME:
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py":
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_the_tour_names_every_runtime_module_where_it_is() -> None:
    toured, actual = toured_modules(tour_block()), runtime_modules()
    assert not actual - toured, f"modules the tour leaves out: {sorted(actual - toured)}"
    assert not toured - actual, f"modules the tour names that are not there: {toured - actual}"


def test_the_tour_check_sees_a_module_left_out_or_misplaced() -> None:
    lines = tour_block()
    without = [line.replace("drr.py", "---.py") for line in lines]
    assert "router/admission/drr.py" not in toured_modules(without)
    moved = [line.replace("  ring.py ", "  ringx.py") for line in lines]
    assert "router/placement/ring.py" not in toured_modules(moved)
