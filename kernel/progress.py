"""Progress evidence: a signature over what counts as progress, and call fingerprints."""

from __future__ import annotations

import hashlib
from typing import Any

from kernel.jsontext import canonical_text
from kernel.record import TrajectoryRecord


def canonical(value: Any) -> bytes:
    """Canonical JSON bytes: sorted keys, no whitespace; the input of every digest."""
    return canonical_text(value).encode()


def digest(value: Any, size: int = 16) -> str:
    """A stable content digest (sha256, hex, truncated); never Python's salted ``hash``."""
    return hashlib.sha256(canonical(value)).hexdigest()[:size]


def signature(rec: TrajectoryRecord) -> str:
    """Hash of the facts and the plan step statuses; a step that leaves it unchanged stalled."""
    # A status is a str enum: it encodes as its value.
    return digest({"facts": rec.facts, "plan": [[s.id, s.status] for s in rec.plan]}, size=12)


def fingerprint(tool: str, args: Any) -> str:
    """The identity of a proposed call, for the repeat limit."""
    return digest([tool, args], size=12)
