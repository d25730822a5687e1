"""What reins assumes of the store's Redis, checked against the running server's configuration.

reins keeps every trajectory's record, chain and the fleet's queues in Redis, so it assumes a
server that keeps what it acknowledged and never drops a key to make room: an append-only file
synced every second or on every write, and ``maxmemory-policy noeviction`` (README,
"Durability"). :func:`durability_warnings` says where a server's ``CONFIG GET`` contradicts
that; ``reins doctor`` prints them. A server that refuses ``CONFIG`` (managed Redis often
does) gets one warning saying what to check by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from store.redis_client import text

#: The parameters read, and what each must say.
CHECKED = ("appendonly", "appendfsync", "maxmemory-policy", "maxmemory")
FSYNC_OK = ("everysec", "always")


@dataclass(frozen=True)
class Durability:
    """The server's durability parameters as read (empty when it refused), and the warnings."""

    config: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """For ``reins doctor --json``."""
        return {"config": self.config, "warnings": self.warnings}


def durability_warnings(config: Mapping[str, str]) -> list[str]:
    """What in ``config`` (parameter -> value, as ``CONFIG GET`` answers) contradicts what reins
    assumes; empty when nothing does."""
    out = []
    if config.get("appendonly") != "yes":
        out.append(
            "Redis appendonly is not yes: a restart loses every commit since the last RDB snapshot "
            "(set appendonly yes)"
        )
    elif config.get("appendfsync") not in FSYNC_OK:
        out.append(
            f"Redis appendfsync is {config.get('appendfsync')!r}: a crash may lose more than "
            "a second of acknowledged commits (set everysec, or always)"
        )
    if config.get("maxmemory-policy") != "noeviction":
        out.append(
            f"Redis maxmemory-policy is {config.get('maxmemory-policy')!r}: under memory pressure "
            "Redis deletes keys, and an evicted snapshot or chain is a lost trajectory "
            "(set noeviction: writes are refused instead, and reins retries them)"
        )
    if config.get("maxmemory") in ("0", None):
        out.append(
            "Redis maxmemory is 0 (no limit): the kernel's OOM killer, not Redis, decides what "
            "happens when memory runs out (set it below the machine's or the pod's limit)"
        )
    return out


def read_durability(client: redis.Redis) -> Durability:
    """The running server's parameters and the warnings they earn."""
    try:
        config: dict[str, str] = {}
        for name in CHECKED:
            reply = client.config_get(name)
            config.update({text(k): text(v) for k, v in reply.items()})
    except redis.ResponseError as exc:  # CONFIG renamed or refused: a managed Redis
        return Durability(
            {},
            [
                f"Redis refused CONFIG GET ({exc}): check by hand that it keeps "
                "an append-only file (appendfsync everysec or always) and never evicts "
                "(maxmemory-policy noeviction)"
            ],
        )
    return Durability(config, durability_warnings(config))
