"""The layer gates of ``make lint`` fail on a wrong import, and name it.

Each case copies the packages and ``pyproject.toml`` to a fresh directory, adds one import that
breaks a rule, and runs the same command ``make lint`` runs there; the unchanged copy passes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kernel", "store", "router", "worker", "api", "ops", "examples")
BIN = Path(sys.executable).parent


def _copy(tmp_path: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_layers_hold_on_this_tree(tmp_path: Path) -> None:
    out = _lint_imports(_copy(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        # the router importing the worker: a layer upside down
        (
            "router/placement/ring.py",
            "import worker.turn  # noqa",
            "router.placement.ring -> worker.turn",
        ),
        # the store importing the router
        (
            "store/in_process.py",
            "import router.placement.ring  # noqa",
            "store.in_process -> router.placement.ring",
        ),
        # an example reaching past the kernel
        ("examples/support_store/policies.py", "import store.base  # noqa", "store.base"),
        # the kernel doing I/O
        ("kernel/render.py", "import redis  # noqa", "kernel.render -> redis"),
        # a cycle between kernel modules
        ("kernel/record.py", "import kernel.step  # noqa", ".record -> .step"),
        # placement reaching into admission: the two are independent
        (
            "router/placement/ring.py",
            "import router.admission.drr  # noqa",
            "router.placement.ring -> router.admission.drr",
        ),
        # the wire importing the router process above it
        (
            "router/wire/feed.py",
            "import router.process.dispatch  # noqa",
            "router.wire.feed -> router.process.dispatch",
        ),
        # the in-process admission policy knowing Redis
        (
            "router/admission/drr.py",
            "import router.admission.redis.state  # noqa",
            "router.admission.drr -> router.admission.redis.state",
        ),
        # ops' local fleets importing the CLI above them
        ("ops/local/fleet.py", "import ops.cli.up  # noqa", "ops.local.fleet -> ops.cli.up"),
    ],
)
def test_a_wrong_import_fails_and_is_named(
    tmp_path: Path, module: str, line: str, named: str
) -> None:
    tree = _copy(tmp_path)
    _append(tree / module, line)
    out = _lint_imports(tree)
    assert out.returncode != 0
    assert "BROKEN" in out.stdout
    assert named in out.stdout, out.stdout


def test_an_import_inside_a_kernel_function_fails_ruff(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    check = [str(BIN / "ruff"), "check", "--no-cache", "kernel"]
    assert subprocess.run(check, cwd=tree, capture_output=True, text=True).returncode == 0
    _append(tree / "kernel/render.py", "def late() -> None:\n    import json  # noqa: F401")
    out = subprocess.run(check, cwd=tree, capture_output=True, text=True)
    assert out.returncode != 0
    assert "PLC0415" in out.stdout and "kernel/render.py" in out.stdout
