"""The previous release as the two-build upgrade finds it: named by the changelog, taken from
the clone's history, and a shallow clone refused with a message that says what to do."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops.local.fleet import ROOT
from tests.fleet.builds import Release, full_commit, previous_release

CHANGELOG = """# Changelog

## Unreleased

- something

## 0.3.0

- no commit named yet (this is the release's own commit)

## 0.2.0

Commit `4a9e620` (2026-12-03): the layout.

## 0.1.0

Commit `3c64fdd` (2026-12-02): the first waves.
"""


def test_the_previous_release_is_the_newest_other_than_this_build(tmp_path: Path) -> None:
    path = tmp_path / "CHANGELOG.md"
    path.write_text(CHANGELOG)
    assert previous_release("0.3.0", path) == Release("0.2.0", "4a9e620")
    with pytest.raises(LookupError, match=r"release 0\.3\.0 .* names no 'Commit"):
        previous_release("0.3.1.dev0", path)


def test_this_changelog_names_the_previous_release_and_its_commit_is_in_the_history() -> None:
    release = previous_release("0.3.0.dev0")
    assert release.version == "0.2.0"
    assert full_commit(release).startswith(release.commit)


def test_a_shallow_clone_fails_saying_how_to_get_the_history(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(
        ["git", "clone", "-q", "--depth", "1", f"file://{ROOT}", str(clone)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(RuntimeError, match=r"this clone is shallow.*fetch-depth: 0"):
        full_commit(previous_release("0.3.0.dev0"), clone)
