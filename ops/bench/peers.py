"""What a benchmark measures reins against: every bench's JSON names it under ``peer``.

A ratio means little without knowing what stood on the other side: which package at which
version, and which path through it (a pooled client or a pinned connection, a checkpointer,
a broker). Each bench module declares ``peer(...) -> Peer`` for the options its ``run`` takes,
and puts ``peer(...).as_json()`` in its result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata

#: The version of a package that is not installed (its bench refuses to run without it).
NOT_INSTALLED = "not installed"

#: The name of the peer of a bench that compares against stated bounds, not another system.
NO_PEER = "none"


@dataclass(frozen=True)
class Peer:
    """The other side of a bench: what it is, its installed version, the path it takes."""

    name: str
    version: str
    path: str

    def as_json(self) -> dict[str, str]:
        """The ``peer`` object of the bench's JSON, by field name."""
        return asdict(self)


def installed(package: str) -> str:
    """The installed version of ``package`` (distribution name), or :data:`NOT_INSTALLED`."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def reins_itself(name: str, path: str) -> Peer:
    """A peer that is reins's own code another way (a baseline in the bench, or another path
    through the same client): its version is the installed reins's."""
    return Peer(name=name, version=installed("reins"), path=path)


def none(judged_against: str) -> Peer:
    """No peer: the bench's figures are judged against ``judged_against`` (stated bounds)."""
    return Peer(name=NO_PEER, version="n/a", path=judged_against)
