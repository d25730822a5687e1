"""Reading a memory store raw, past its API: every Redis key under a prefix and everything in
it, or every row of every table of a SQLite file (the FTS index's own tables included).

Erasure and expiry tests ask :func:`mentions` where a string still appears: in a key's name,
or in any field, member or value of any key, or in any column of any row. Index keys name users
and calls by :func:`kernel.memory.name_token`, so a test looks for the tokens too.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator

import redis

from kernel.memory import name_token
from store.memory_base import DictMemory, MemoryBank
from store.memory_redis import RedisMemory
from store.memory_sqlite import SqliteMemory


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def redis_dump(client: redis.Redis, prefix: str) -> Iterator[tuple[str, str]]:
    """(key, one of its parts) for every key under ``prefix`` (plain or hash-tagged), its name
    included: hash fields and values, set and sorted-set members, strings, list elements."""
    keys = {*client.scan_iter(match=f"{prefix}*", count=1000)}
    keys |= {*client.scan_iter(match=f"{{{prefix}*", count=1000)}
    for raw in sorted(keys):
        key = _text(raw)
        yield key, key
        kind = _text(client.type(raw))
        parts: Iterable[object] = ()
        if kind == "hash":
            parts = [p for kv in client.hgetall(raw).items() for p in kv]  # type: ignore[union-attr]
        elif kind == "set":
            parts = client.smembers(raw)  # type: ignore[assignment]
        elif kind == "zset":
            parts = client.zrange(raw, 0, -1)  # type: ignore[assignment]
        elif kind == "string":
            parts = [client.get(raw)]
        elif kind == "list":
            parts = client.lrange(raw, 0, -1)  # type: ignore[assignment]
        for part in parts:
            yield key, _text(part)


def sqlite_dump(path: str) -> Iterator[tuple[str, str]]:
    """(table, one row as text) for every row of every table of the file."""
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                yield table, " ".join(_text(c) for c in row)
    finally:
        conn.close()


def dump(bank: MemoryBank, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Everything ``bank`` holds, raw (see the module docstring)."""
    if isinstance(bank, RedisMemory):
        yield from redis_dump(bank._client, prefix or bank.prefix)
    elif isinstance(bank, SqliteMemory):
        yield from sqlite_dump(str(bank.path))
    elif isinstance(bank, DictMemory):
        for item_id, item in bank._items.items():
            yield item_id, item.model_dump_json()
    else:  # pragma: no cover
        raise TypeError(f"no raw view of {bank!r}")


def mentions(bank: MemoryBank, needles: Iterable[str], prefix: str = "") -> list[tuple[str, str]]:
    """Where any of ``needles`` (or a user's or call's name token of one) still appears."""
    wanted = {n for needle in needles for n in (needle, name_token(needle))}
    return [(where, part) for where, part in dump(bank, prefix) if any(w in part for w in wanted)]
