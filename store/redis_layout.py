"""Which key layout a Redis store was written in: the marker, the refusal of an older layout,
and the migration from it (``reins store migrate``).

Layout 1 kept a trajectory under ``{P:T:I}:snap`` and ``{P:T:I}:chain`` and a tenant's whole
index and owing set under ``{P:T}:index`` and ``{P:T}:owing``, two slots per commit. Layout 2
is :mod:`store.redis_keys`. The record's schema (``SCHEMA_VERSION``) is another matter: a
migration copies records byte for byte. Why: ``docs/adr/0170-store-on-redis-cluster.md``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import unquote

import redis

from kernel.errors import UnsupportedLayout
from store.base import TrajectoryKey
from store.redis_client import text
from store.redis_keys import COMMITS_KEPT, LAYOUT, commit_keys, layout_key

_PART = r"([^:{}#]+)"  # an encoded tenant, trajectory id or idempotency key


def _old_patterns(prefix: str) -> dict[str, re.Pattern[str]]:
    tag = "\\{" + re.escape(prefix) + ":" + _PART
    return {
        "snap": re.compile(f"^{tag}:{_PART}\\}}:snap$"),
        "chain": re.compile(f"^{tag}:{_PART}\\}}:chain$"),
        "index": re.compile(f"^{tag}\\}}:index$"),
        "owing": re.compile(f"^{tag}\\}}:owing$"),
        "idem": re.compile(f"^{tag}:{_PART}\\}}:idem$"),
    }


def old_keys(client: redis.Redis, prefix: str) -> Iterator[tuple[str, re.Match[str], str]]:
    """Every key of layout 1 under ``prefix``: (kind, match, key); ``idem`` keys, whose name
    did not change, too."""
    patterns = _old_patterns(prefix)
    for raw in client.scan_iter(match=f"{{{prefix}:*", count=1000):
        key = text(raw)
        for kind, pattern in patterns.items():
            found = pattern.match(key)
            if found:
                yield kind, found, key
                break


def check_layout(client: redis.Redis, prefix: str) -> None:
    """Return if the store under ``prefix`` is in this build's layout (its marker says so, or
    it holds no key of layout 1: then the marker is written); else raise
    :class:`UnsupportedLayout` saying what to run. Costs one ``GET`` once the marker is there;
    the first time, one ``SCAN`` of the keyspace."""
    marker = client.get(layout_key(prefix))
    if marker is not None:
        if text(marker) == LAYOUT:
            return
        raise UnsupportedLayout(
            f"the store under prefix {prefix!r} is in key layout {text(marker)}; this build "
            f"reads layout {LAYOUT}: deploy the build that wrote it"
        )
    for kind, _, key in old_keys(client, prefix):
        if kind != "idem":
            raise UnsupportedLayout(
                f"the store under prefix {prefix!r} was written in key layout 1 (found {key}); "
                f"stop every reins process on it and run 'reins store migrate'"
            )
    client.set(layout_key(prefix), LAYOUT, nx=True)


@dataclass
class Migrated:
    """What :func:`migrate` moved."""

    trajectories: int = 0
    chains: int = 0
    indexed: int = 0
    owing: int = 0
    ledger: int = 0
    commit_ids_trimmed: int = 0
    deleted: list[str] = field(default_factory=list)


def migrate(source: redis.Redis, target: redis.Redis, prefix: str, *, same: bool) -> Migrated:
    """Copy every layout-1 key under ``prefix`` from ``source`` to its layout-2 name on
    ``target`` (``DUMP``/``RESTORE REPLACE``, so running it again after a failure is safe),
    keeping the last :data:`COMMITS_KEPT` commit ids of each snapshot and indexing each
    snapshot by its own state (the old index is derived, so it is not copied), then write the
    layout marker and, when ``same`` (one Redis, migrated in place), delete the old keys. Run
    it with every reins process on the store stopped."""
    done = Migrated()
    old: list[str] = []
    for kind, found, key in old_keys(source, prefix):
        tenant = unquote(found.group(1))
        if kind == "idem":  # the ledger's key did not change: copied only to another Redis
            if not same and _copy(source, target, key, key):
                done.ledger += 1
            continue
        if kind in ("snap", "chain"):
            _move_trajectory_key(
                source, target, prefix, TrajectoryKey(tenant, unquote(found.group(2))), key, done
            )
        elif kind == "owing":
            for member, _ in source.zscan_iter(key):
                tid = text(member)
                target.zadd(commit_keys(prefix, tenant, tid)[3], {tid: 0})
                done.owing += 1
        old.append(key)
    target.set(layout_key(prefix), LAYOUT)
    if same:
        for key in old:
            source.delete(key)
        done.deleted = old
    return done


def _copy(source: redis.Redis, target: redis.Redis, key: str, new_key: str) -> bool:
    dumped = source.dump(key)
    if dumped is None:  # gone meanwhile
        return False
    target.restore(new_key, 0, dumped, replace=True)
    return True


def _move_trajectory_key(
    source: redis.Redis,
    target: redis.Redis,
    prefix: str,
    trajectory: TrajectoryKey,
    key: str,
    done: Migrated,
) -> None:
    snap_key, chain_key, index_key, _ = commit_keys(prefix, *trajectory)
    if key.endswith("}:chain"):
        done.chains += _copy(source, target, key, chain_key)
        return
    if not _copy(source, target, key, snap_key):
        return
    done.trajectories += 1
    done.commit_ids_trimmed += _trim_commit_ids(target, snap_key)
    code = target.hget(snap_key, "s")
    if code is not None:
        target.zadd(index_key, {trajectory[1]: int(text(code))})
        done.indexed += 1


def _trim_commit_ids(client: redis.Redis, snap_key: str) -> int:
    """Delete the commit ids of all but the last :data:`COMMITS_KEPT` versions."""
    version = client.hget(snap_key, "v")
    if version is None:
        return 0
    keep_from = int(text(version)) - COMMITS_KEPT + 1
    stale = [
        text(name)
        for name in client.hkeys(snap_key)
        if text(name)[:1] == "c" and text(name)[1:].isdigit() and int(text(name)[1:]) < keep_from
    ]
    return int(client.hdel(snap_key, *stale)) if stale else 0
