"""The chart, a real helm to render it (``make tools`` puts one at .tools/helm), and a parser of
what it renders that refuses a key given twice in one mapping.

PyYAML keeps the last of two equal keys without a word; YAML says the keys of a mapping are
unique, and other parsers refuse the manifest or keep the first, so a chart that repeats a key
deploys differently depending on who reads it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "reins"


def helm_binary() -> str | None:
    local = ROOT / ".tools" / "helm"
    return str(local) if local.exists() else shutil.which("helm")


HELM = helm_binary()
needs_helm = pytest.mark.skipif(
    HELM is None, reason="no helm: run ops/scripts/ensure-helm.sh (make tools)"
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


class RepeatedKey(yaml.constructor.ConstructorError):
    """A mapping of the rendered YAML names one key twice."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise RepeatedKey(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found the key {key!r} again",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def manifests(text: str) -> tuple[dict[str, Any], ...]:
    """The documents of ``helm template``'s output, empty ones left out."""
    return tuple(d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d)
