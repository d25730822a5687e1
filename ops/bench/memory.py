"""``reins bench memory``: recall latency at 10k and 100k facts per owner, SQLite and Redis,
beside a brute-force scan of the same rows.

For each size, one owner (a user of tenant ``bench``) holds that many facts, each with three
tags from a vocabulary of 2,000; the user's tenant and agent scopes hold a tenth as many
each, and another tenant as many again (rows a recall must never see). Every query asks for
three tags. The peer is the plain scan: read every row of the tenant and rank it with
``kernel.memory.recall``; both must return the same items (``agree``). Redis keys live under a
fresh prefix and the SQLite file in a temporary directory, both deleted after.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from kernel.memory import MemoryItem, MemoryKind, Scope, Visibility, recall
from kernel.settings import Settings
from ops.bench.peers import Peer, reins_itself
from store.memory_base import MemoryBank
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory
from store.redis_client import client_from_url

VOCAB = [f"topic{i}" for i in range(2000)]
CALLER = Visibility("bench", "cu_bench", "support")
NOW = 1_800_000_000_000


def _facts(count: int, rng: random.Random) -> list[MemoryItem]:
    """``count`` facts of the caller's user, a tenth as many of its tenant and agent, and
    ``count`` of another tenant's user with the same tags."""
    owners = [
        ("bench", Scope.USER, "cu_bench", count),
        ("bench", Scope.TENANT, "", count // 10),
        ("bench", Scope.AGENT, "support", count // 10),
        ("other", Scope.USER, "cu_bench", count),
    ]
    out = []
    for tenant, scope, subject, n in owners:
        for i in range(n):
            out.append(
                MemoryItem(
                    kind=MemoryKind.FACT,
                    tenant=tenant,
                    scope=scope,
                    subject=subject,
                    key=f"{scope.value}-{i}",
                    value={"text": f"fact {i} of {tenant}/{scope.value}"},
                    tags=rng.sample(VOCAB, 3),
                    written_ms=NOW - rng.randrange(10**9),
                )
            )
    return out


def _percentiles(fn: Callable[[list[str]], Any], queries: list[list[str]]) -> dict[str, float]:
    times = []
    for tags in queries:
        started = time.perf_counter()
        fn(tags)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "p50_ms": round(1000 * statistics.median(times), 3),
        "p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 3),
        "queries": len(times),
    }


def _scan(bank: MemoryBank) -> Callable[[list[str]], list[MemoryItem]]:
    """The peer: every row of the caller's tenant read and ranked by the plain recall."""

    def ask(tags: list[str]) -> list[MemoryItem]:
        rows = bank.items(CALLER.tenant, MemoryKind.FACT)
        return recall(rows, CALLER, MemoryKind.FACT, tags, NOW, 10)

    return ask


def _measure(
    bank: MemoryBank, queries: list[list[str]], scans: int
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    def ask(tags: list[str]) -> list[MemoryItem]:
        return bank.recall(CALLER, MemoryKind.FACT, tags, NOW, 10)

    indexed = _percentiles(ask, queries)
    scanned_answers: list[tuple[list[str], list[MemoryItem]]] = []
    scan = _scan(bank)

    def kept_scan(tags: list[str]) -> None:
        scanned_answers.append((tags, scan(tags)))

    scanned = _percentiles(kept_scan, queries[:scans])
    return indexed, scanned, all(ask(tags) == found for tags, found in scanned_answers)


def peer() -> Peer:
    """The brute-force scan: every row of the caller's tenant, ranked by the plain recall."""
    return reins_itself(
        "brute-force scan",
        "every row of the caller's tenant read from the same bank (SQLite, Redis) and ranked "
        "by kernel.memory.recall, in this process",
    )


def run(quick: bool = False) -> dict[str, object]:
    """Measure and return one JSON-ready object (see the module docstring)."""
    settings = Settings.from_env(os.environ)
    sizes = (1_000, 5_000) if quick else (10_000, 100_000)
    rng = random.Random(7)
    client = client_from_url(settings.redis_url)
    prefix = f"{settings.key_prefix}-bench-{uuid.uuid4().hex[:8]}"
    result: dict[str, object] = {
        "peer": peer().as_json(),
        "vocabulary": len(VOCAB),
        "tags_per_fact": 3,
        "limit": 10,
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for size in sizes:
                facts = _facts(size, rng)
                queries = [rng.sample(VOCAB, 3) for _ in range(50 if quick else 200)]
                scans = 3 if quick or size > 10_000 else 10  # a 100k scan takes seconds
                sqlite = SqliteMemory(Path(tmp) / f"m{size}.db")
                sqlite.put_many(facts)
                red = RedisMemory(client, prefix=f"{prefix}-{size}")
                red.put_many(facts)
                figures: dict[str, object] = {"rows": len(facts)}
                for name, bank in (("sqlite", sqlite), ("redis", red)):
                    indexed, scanned, agree = _measure(bank, queries, scans)
                    figures[name] = indexed
                    figures[f"{name}_scan"] = scanned
                    figures[f"{name}_speedup_p50"] = round(
                        scanned["p50_ms"] / max(indexed["p50_ms"], 1e-6), 1
                    )
                    figures[f"{name}_agrees_with_scan"] = agree
                sqlite.close()
                result[f"facts_per_owner_{size}"] = figures
    finally:
        _delete(client, prefix)
        client.close()
    return result


def _delete(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{{{prefix}*", count=5000))
    for i in range(0, len(keys), 5000):
        client.delete(*keys[i : i + 5000])
