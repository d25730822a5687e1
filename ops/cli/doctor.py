"""``reins doctor``: the state of the fleet's feed and its Redis, for a person or a script.

Reads (and never writes) the Redis named by ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``: the
length of each stream of the feed (notices, hand-backs, dead letters) and how much of it is
taken and not acknowledged; each router's pending entries with how long they have been idle
(a router that died leaves them, and another takes them over once they are idle longer than
``REINS_HEARTBEAT_TIMEOUT_S``); the dead letters, newest first; and where the server's
configuration contradicts what reins assumes of it (:mod:`ops.cli.durability`). Design:
``docs/adr/0045-durable-feed.md``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from kernel.settings import Settings
from ops.cli.connect import fleet_redis
from ops.cli.durability import read_durability
from router.wire.feed import Feed, FeedSource
from router.wire.streams import (
    DeadLetter,
    PendingEntry,
    dead_letters,
    pending_counts,
    pending_entries,
)

console = Console()
SHOWN_RAW = 48  # characters of a dead letter's raw bytes the table shows


@dataclass(frozen=True)
class RouterPending:
    """What one router holds of one stream: taken, not acknowledged."""

    stream: str
    router: str
    entries: int
    shown: list[PendingEntry]  # the oldest, up to the limit asked for

    def as_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "router": self.router,
            "entries": self.entries,
            "oldest_idle_s": self.oldest_idle_s,
            "pending": [
                {"id": e.id, "idle_s": e.idle_s, "deliveries": e.deliveries} for e in self.shown
            ],
        }

    @property
    def oldest_idle_s(self) -> float:
        """The longest any shown entry has been idle since it was last delivered."""
        return max((e.idle_s for e in self.shown), default=0.0)


@dataclass(frozen=True)
class FeedHealth:
    """Everything ``reins doctor`` shows, read in one go."""

    prefix: str
    lengths: dict[str, int]  # by source: notices, handbacks, and "dead"
    pending: list[RouterPending]
    dead: list[DeadLetter]

    def as_json(self) -> dict[str, Any]:
        held = {s: sum(p.entries for p in self.pending if p.stream == s) for s in self.lengths}
        return {
            "prefix": self.prefix,
            "streams": {
                name: {"length": n, "pending": held.get(name, 0)}
                for name, n in self.lengths.items()
            },
            "pending": [p.as_json() for p in self.pending],
            "dead_letters": [
                {
                    "id": d.id,
                    "at": d.at,
                    "source": d.source,
                    "stream": d.stream,
                    "entry": d.entry,
                    "error": d.error,
                    "raw": d.raw.decode("utf-8", "backslashreplace"),
                }
                for d in self.dead
            ],
        }


def read_health(client: redis.Redis, prefix: str, limit: int) -> FeedHealth:
    """The feed of ``prefix``: stream lengths, pending entries per router (up to ``limit``
    shown each), the newest ``limit`` dead letters."""
    feed = Feed(client, prefix)
    streams = {
        FeedSource.NOTICES.value: feed.notices_key,
        FeedSource.HANDBACKS.value: feed.handbacks_key,
    }
    lengths = {name: int(client.xlen(key)) for name, key in streams.items()}
    lengths["dead"] = int(client.xlen(feed.dead_key))
    pending = []
    for name, key in streams.items():
        for router, count in sorted(pending_counts(client, key).items()):
            if count:
                shown = pending_entries(client, key, limit, router)
                pending.append(RouterPending(name, router, count, shown))
    return FeedHealth(prefix, lengths, pending, dead_letters(client, feed.dead_key, limit))


def doctor_cmd(
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    limit: int = typer.Option(20, "--limit", min=1, help="dead letters and pending entries shown"),
) -> None:
    """The feed: stream lengths, each router's pending entries, the dead letters; and where
    Redis's configuration contradicts what reins assumes (append-only file, no eviction)."""
    settings = Settings.from_env(os.environ)
    with fleet_redis(settings) as (_, client):
        health = read_health(client, settings.key_prefix, limit)
        durability = read_durability(client)
    if as_json:
        view = {**health.as_json(), "durability": durability.as_json()}
        sys.stdout.write(json.dumps(view, sort_keys=True) + "\n")
        return
    for warning in durability.warnings:
        console.print(f"[bold yellow]warning:[/] {warning}")
    console.print(f"feed of [bold]{settings.key_prefix}[/] on {settings.redis_url}")
    console.print(_streams_table(health))
    console.print(_pending_table(health))
    console.print(_dead_table(health))


def _table(title: str) -> Table:
    return Table(title=title, box=box.MINIMAL_HEAVY_HEAD, show_edge=False, pad_edge=False)


def _streams_table(health: FeedHealth) -> Table:
    table = _table("streams")
    for column in ("stream", "entries", "taken, not acknowledged"):
        table.add_column(column, justify="left" if column == "stream" else "right")
    held = health.as_json()["streams"]
    for name, length in health.lengths.items():
        table.add_row(name, f"{length:,}", "-" if name == "dead" else f"{held[name]['pending']:,}")
    return table


def _pending_table(health: FeedHealth) -> Table:
    table = _table("pending entries per router")
    for column in ("stream", "router", "entries", "oldest idle", "most deliveries"):
        table.add_column(column, justify="right" if column[0] in "eom" else "left")
    for p in health.pending:
        deliveries = max((e.deliveries for e in p.shown), default=0)
        table.add_row(
            p.stream, p.router, f"{p.entries:,}", f"{p.oldest_idle_s:.1f}s", str(deliveries)
        )
    if not health.pending:
        table.caption = "nothing taken and not acknowledged"
    return table


def _dead_table(health: FeedHealth) -> Table:
    table = _table("dead letters, newest first")
    for column in ("when (UTC)", "source", "error", "raw"):
        table.add_column(column, overflow="fold")
    for d in health.dead:
        when = datetime.fromtimestamp(d.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(when, d.source, d.error, shorten(d.raw))
    if not health.dead:
        table.caption = "no dead letters"
    return table


def shorten(raw: bytes, width: int = SHOWN_RAW) -> str:
    """``raw`` as readable text, cut to ``width`` characters with an ellipsis."""
    shown = raw.decode("utf-8", "backslashreplace")
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def register(app: typer.Typer) -> None:
    """Attach ``reins doctor`` to the CLI."""
    app.command("doctor")(doctor_cmd)
