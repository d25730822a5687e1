"""``reins ring``: look at the placement ring, drain a worker, remove it once idle.

Reads the membership from the Redis named by ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``, and
builds the ring exactly as every router replica does, so the fingerprint shown here is the one
each live replica should be publishing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis
import typer
from rich.console import Console
from rich.table import Table

from kernel.errors import RingError, StoreError
from kernel.settings import Settings
from router.membership import MemberRecord, Membership
from router.ring import Ring, points_for

ring_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The placement ring: show members and replicas, drain a worker, remove it.",
)
console = Console()

_POLL_S = 0.2  # how often `drain --wait` re-reads the replicas' reports


@contextmanager
def _membership() -> Iterator[Membership]:
    """A membership on the configured Redis; Redis failures become one StoreError line."""
    settings = Settings.from_env(os.environ)
    client = redis.Redis.from_url(settings.redis_url)
    try:
        yield Membership(
            client, settings.key_prefix, heartbeat_timeout_s=settings.heartbeat_timeout_s
        )
    except redis.RedisError as exc:
        raise StoreError(f"Redis at {settings.redis_url}: {exc}") from None
    finally:
        client.close()


@ring_app.command("show")
def show_cmd(
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Members (weight, state, points, share of new placements), fingerprint, replicas."""
    with _membership() as membership:
        records = membership.records()
        ring = membership.build_ring()
        replicas = membership.replicas()
    shares = ring.shares()
    if as_json:
        view = {
            "fingerprint": ring.fingerprint,
            "points": ring.point_count,
            "members": [
                {
                    "name": r.name,
                    "weight": r.weight,
                    "state": _state(r),
                    "share": shares.get(r.name, 0.0),
                }
                for r in records
            ],
            "replicas": [
                {"id": p.replica_id, "fingerprint": p.fingerprint, "live": p.live} for p in replicas
            ],
        }
        sys.stdout.write(json.dumps(view, sort_keys=True) + "\n")
        return
    console.print(_members_table(records, ring, shares))
    console.print(f"ring fingerprint [bold]{ring.fingerprint}[/] ({ring.point_count:,} points)")
    if not replicas:
        console.print("no router replica has published a ring")
        return
    table = Table(title="router replicas")
    for column in ("replica", "fingerprint", "agrees", "live"):
        table.add_column(column)
    for report in replicas:
        agrees = "yes" if report.fingerprint == ring.fingerprint else "[red]no[/]"
        table.add_row(report.replica_id, report.fingerprint, agrees, "yes" if report.live else "no")
    console.print(table)


@ring_app.command("drain")
def drain_cmd(
    name: str = typer.Argument(..., help="the worker to drain"),
    wait: float = typer.Option(
        0.0, "--wait", min=0.0, help="seconds to wait for every live replica to acknowledge"
    ),
) -> None:
    """Stop new placements on NAME; its points stay, its work in flight finishes."""
    with _membership() as membership:
        membership.drain(name)
        status = membership.drain_status(name)
        deadline = time.monotonic() + wait
        while not status.acknowledged and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            status = membership.drain_status(name)
    if status.acknowledged:
        replicas = ", ".join(status.live_replicas)
        console.print(f"{name} draining: acknowledged by every live replica ({replicas})")
        return
    if not status.live_replicas:
        console.print(f"{name} draining: no live router replica to acknowledge it yet")
    else:
        console.print(f"{name} draining: waiting on replicas {', '.join(status.pending)}")
    if wait > 0:
        # SystemExit, not typer.Exit: the top-level app runs with standalone_mode=False, which
        # would swallow typer.Exit's code, and a script waiting on the drain needs to see it.
        raise SystemExit(1)


@ring_app.command("remove")
def remove_cmd(
    name: str = typer.Argument(..., help="the worker to remove"),
    force: bool = typer.Option(False, "--force", help="remove even if NAME is not draining"),
) -> None:
    """Remove NAME from the ring; refused unless it drains first (or --force)."""
    with _membership() as membership:
        record = next((r for r in membership.records() if r.name == name), None)
        if record is not None and not record.draining and not force:
            # Removing an active worker reassigns its sessions at once: the deploy hazard that
            # drain-then-remove exists to avoid.
            raise RingError(
                f"member {name!r} is not draining; run 'reins ring drain {name}' and remove it "
                "once idle, or pass --force"
            )
        membership.remove(name)
    console.print(f"{name} removed from the ring")


def _members_table(
    records: tuple[MemberRecord, ...], ring: Ring, shares: dict[str, float]
) -> Table:
    table = Table(title="ring members")
    table.add_column("member")
    table.add_column("weight", justify="right")
    table.add_column("state")
    table.add_column("points", justify="right")
    table.add_column("share", justify="right")
    for record in records:
        in_ring = record.name in ring
        table.add_row(
            record.name,
            f"{record.weight:g}",
            _state(record),
            f"{points_for(record.weight, ring.points_per_weight):,}" if in_ring else "-",
            f"{shares[record.name]:.2%}" if in_ring else "-",
        )
    if not records:
        table.caption = "no members registered"
    return table


def _state(record: MemberRecord) -> str:
    state = "draining" if record.draining else "active"
    return state if record.live else f"lapsed ({state})"
