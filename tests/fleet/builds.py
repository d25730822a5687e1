"""Two builds side by side: this working tree, and the previous release installed in a virtual
environment of its own, for the two-build rolling upgrade (``test_two_builds.py``).

The previous release is the newest ``## X.Y.Z`` section of ``CHANGELOG.md``, which names its
commit (tags may not travel with a clone; the changelog does). Its build comes from the clone's
own history: ``git worktree add --detach`` of that commit in a temporary directory, a
``python -m venv`` under ``.reins/builds/<commit>/venv``, ``pip install`` of the checkout (a
wheel, as a deployment installs it, not an editable link), then the worktree is removed. The
environment is kept, keyed by commit (a stamp file marks it complete), so later runs start at
once; a half-built one is rebuilt. A shallow clone, or one without the commit, fails with a
message that says how to get the history.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ops.local.fleet import ROOT

#: A release's heading and the line naming its commit, as ``CHANGELOG.md`` writes them.
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+)\s*$", re.M)
COMMIT = re.compile(r"Commit `([0-9a-f]{7,40})`")
#: Where built environments are kept, keyed by commit.
CACHE = ROOT / ".reins" / "builds"
STAMP = ".complete"
#: The directory both builds' workers load their backend from (``shared_store``).
BOTH = Path(__file__).resolve().parent / "both_builds"


@dataclass(frozen=True)
class Release:
    """A release the changelog names: its version and its commit."""

    version: str
    commit: str


@dataclass(frozen=True)
class Build:
    """How to run a build's processes: its Python, the directory they start in (which
    ``python -m`` puts first on the path), and what goes on ``PYTHONPATH``."""

    name: str
    python: str
    cwd: Path
    pythonpath: str

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": self.pythonpath}

    def version(self) -> str:
        """The installed package's version, as this build's Python reports it."""
        code = "import importlib.metadata as m; print(m.version('reins'))"
        done = run([self.python, "-c", code], cwd=self.cwd, env={**os.environ, **self.env()})
        return done.stdout.strip()


def this_build() -> Build:
    """The working tree, as the test suite runs it (its virtual environment's Python)."""
    return Build("this", sys.executable, ROOT, os.pathsep.join([str(ROOT), str(BOTH)]))


def previous_release(this_version: str, changelog: Path = ROOT / "CHANGELOG.md") -> Release:
    """The newest release ``changelog`` names other than ``this_version`` (at a release's own
    commit its section cannot name the commit yet), with the commit it names; an error naming
    the release if its section names none."""
    text = changelog.read_text(encoding="utf-8")
    headings = list(RELEASE.finditer(text))
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        if heading[1] == this_version:
            continue
        body = text[heading.end() : following.start() if following else len(text)]
        commit = COMMIT.search(body)
        if commit is None:
            raise LookupError(f"release {heading[1]} in {changelog} names no 'Commit `hash`'")
        return Release(heading[1], commit[1])
    raise LookupError(f"{changelog} names no release (a '## X.Y.Z' heading) before {this_version}")


def installed(release: Release, workdir: Path) -> Build:
    """``release``'s build in its own virtual environment (built unless kept from an earlier
    run); its processes start in ``workdir``, away from this tree's packages."""
    full = full_commit(release)
    home = CACHE / full[:12]
    venv = home / "venv"
    if not (home / STAMP).exists():
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        _build(full, venv)
        (home / STAMP).write_text(f"{release.version} {full}\n")
    workdir.mkdir(parents=True, exist_ok=True)
    return Build(release.version, str(venv / "bin" / "python"), workdir, str(BOTH))


def full_commit(release: Release, root: Path = ROOT) -> str:
    """The full hash of ``release``'s commit in the clone at ``root``; an error saying how to
    get the history if the clone lacks it (a shallow clone, as CI checks out by default)."""
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        raise RuntimeError(
            f"{root} is not a git clone: the previous release comes from its history"
        )
    shallow = run([git, "rev-parse", "--is-shallow-repository"], cwd=root).stdout.strip()
    found = subprocess.run(
        [git, "rev-parse", "--verify", "--quiet", f"{release.commit}^{{commit}}"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        why = "this clone is shallow" if shallow == "true" else "this clone lacks it"
        raise RuntimeError(
            f"release {release.version}'s commit {release.commit} is not in the history ({why}): "
            "clone with full history (git fetch --unshallow, or actions/checkout's "
            "fetch-depth: 0)"
        )
    return found.stdout.strip()


def _build(commit: str, venv: Path) -> None:
    """A worktree of ``commit`` in a temporary directory, installed into ``venv``; the
    worktree is removed whatever happens."""
    with tempfile.TemporaryDirectory(prefix="reins-release-") as tmp:
        src = Path(tmp) / "src"
        run(["git", "worktree", "add", "--detach", str(src), commit], cwd=ROOT)
        try:
            run([sys.executable, "-m", "venv", str(venv)], cwd=ROOT)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
            run([*pip, "--disable-pip-version-check", str(src)], cwd=tmp)
        finally:
            run(["git", "worktree", "remove", "--force", str(src)], cwd=ROOT)


def run(
    cmd: list[str], cwd: Path | str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; raise with its output if it fails."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done
