"""``reins ring``: look at the placement ring, drain a worker, remove it once idle.

Reads the membership from the Redis named by ``REINS_REDIS_URL`` under ``REINS_KEY_PREFIX``, and
builds the ring exactly as every router replica does, so the fingerprint shown here is the one each
live replica should be publishing. ``show`` also reads the reconciler's custody and recoveries
(:mod:`router.process.reconcile`), so a dead or removed worker stays visible with the turns it still
holds and those recovered from it (:mod:`ops.cli.ring_view`). ``show`` writes nothing.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import redis
import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kernel.errors import RingError, StoreError, UnknownMember
from kernel.settings import Settings
from ops.cli.connect import fleet_redis
from ops.cli.ring_view import MemberRow, Recovery, ShownState, member_rows
from router.placement.membership import DrainStatus, Membership
from router.wire.custody import Custody

ring_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="The placement ring: show members and replicas, drain a worker, remove it.",
)
console = Console()

_POLL_S = 0.2  # how often `drain --wait` re-reads the replicas' reports


def _membership_on(settings: Settings, client: redis.Redis) -> Membership:
    return Membership.of(client, settings)


@contextmanager
def _membership() -> Iterator[Membership]:
    """A membership on the configured Redis; Redis failures become one StoreError line."""
    with fleet_redis() as (settings, client):
        yield _membership_on(settings, client)


@ring_app.command("show")
def show_cmd(
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Members (state, points, share, turns in custody and recovered), fingerprint, replicas."""
    with fleet_redis() as (settings, client):
        membership = _membership_on(settings, client)
        custody = Custody(client, settings.key_prefix)
        records = membership.records()
        ring = membership.build_ring()
        replicas = membership.replicas()
        drains = _drain_statuses(membership, [r.name for r in records if r.draining])
        in_custody = _custody_counts(custody)
        recoveries = _recoveries(custody)
        rows = member_rows(records, ring, drains, in_custody, recoveries, custody.redis_now())
    if as_json:
        view = {
            "fingerprint": ring.fingerprint,
            "points": ring.point_count,
            "members": [row.as_json() for row in rows],
            "replicas": [
                {"id": p.replica_id, "fingerprint": p.fingerprint, "live": p.live} for p in replicas
            ],
        }
        sys.stdout.write(json.dumps(view, sort_keys=True) + "\n")
        return
    console.print(_members_table(rows))
    console.print(f"ring fingerprint [bold]{ring.fingerprint}[/] ({ring.point_count:,} points)")
    if not replicas:
        console.print("no router replica has published a ring")
        return
    table = _table("router replicas")
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


_STYLES = {
    ShownState.ACTIVE: "green",
    ShownState.DRAINING: "yellow",
    ShownState.DEAD: "bold red",
    ShownState.GONE: "dim",
}


def _table(title: str) -> Table:
    # No outer edge: the members table has eight columns and should still read at 80 columns.
    return Table(title=title, box=box.MINIMAL_HEAVY_HEAD, show_edge=False, pad_edge=False)


def _members_table(rows: list[MemberRow]) -> Table:
    table = _table("ring members")
    table.add_column("member")
    table.add_column("weight", justify="right")
    table.add_column("state")
    table.add_column("points", justify="right")
    table.add_column("share", justify="right")
    table.add_column("in custody", justify="right")
    table.add_column("recovered", justify="right")
    table.add_column("worst", justify="right")  # last heartbeat to a recovery, worst case
    for row in rows:
        placed = row.points > 0
        table.add_row(
            Text(row.name),
            "-" if row.weight is None else f"{row.weight:g}",
            Text(row.describe(), style=_STYLES[row.state]),
            f"{row.points:,}" if placed else "-",
            f"{row.share:.2%}" if placed else "-",
            str(row.in_custody),
            str(row.recovered),
            "-" if row.worst_recovery_s is None else f"{row.worst_recovery_s:.2f}s",
        )
    if not rows:
        table.caption = "no members registered"
    elif any(row.recovered for row in rows):
        table.caption = "worst: seconds from the member's last heartbeat to a recovery"
    return table


def _drain_statuses(membership: Membership, names: list[str]) -> dict[str, DrainStatus]:
    statuses = {}
    for name in names:
        try:
            statuses[name] = membership.drain_status(name)
        except UnknownMember:
            continue  # removed since the records were read: shown without its drain status
    return statuses


def _custody_counts(custody: Custody) -> dict[str, int]:
    """Turns each custodian has now, read only (``Custody.entrusted_to`` drops bad entries)."""
    custodians = sorted(custody.custodians())
    pipe = custody.client.pipeline(transaction=False)
    for member in custodians:
        pipe.hlen(custody.key(member))
    return dict(zip(custodians, cast(list[int], pipe.execute()), strict=True))


def _recoveries(custody: Custody) -> list[Recovery]:
    """The recorded recoveries; a corrupt entry is reported, not skipped."""
    try:
        return [Recovery.parse(entry) for entry in custody.recoveries()]
    except ValueError as exc:
        raise StoreError(f"{custody.recoveries_key}: {exc}") from None
