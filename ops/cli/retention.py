"""``reins retire`` and ``reins archive``: finished trajectories past their retention, retired
(the routers' retention sweep, one whole walk, now) or written to JSON lines first.

Both work on the fleet's Redis (``REINS_REDIS_URL``, ``REINS_KEY_PREFIX``) over the tenants of
its configuration, each with its retention (``--retention-days`` overrides it; 0 takes every
finished trajectory that owes nothing). Bad input (an unknown tenant, a negative retention, a
path that is not a writable directory) is refused before anything is read or written.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import typer
from rich.console import Console

from kernel.errors import InvalidInput, UnknownTenant
from ops.cli.archive import archive, check_directory
from ops.cli.connect import fleet_redis
from router.admission.tenants import AdmissionConfig
from router.fleet import config as fleet_config
from router.process.retention import DAY_S, RetentionSweep, retention_s
from store.redis_store import RedisStore

console = Console()
TENANT_HELP = "a tenant of the fleet's configuration (repeat; none: every tenant)"
DAYS_HELP = "keep finished trajectories this many days (none: each tenant's retention)"


def retention_by_tenant(
    config: AdmissionConfig, tenants: list[str], days: float | None, default_days: float
) -> dict[str, float]:
    """The retention in seconds of each tenant asked for (every configured one when none is);
    :class:`InvalidInput` naming an unknown tenant or a negative retention."""
    known = [t.name for t in config.tenants]
    unknown = [t for t in tenants if t not in known]
    if unknown:
        raise UnknownTenant(f"unknown tenants {unknown}; the fleet's configuration has {known}")
    if days is not None and days < 0:
        raise InvalidInput(f"--retention-days {days}: must not be negative (0: every one)")
    return {
        t: days * DAY_S if days is not None else retention_s(config, t, default_days)
        for t in dict.fromkeys(tenants or known)
    }


def retire_cmd(
    tenant: list[str] = typer.Option([], "--tenant", help=TENANT_HELP),  # noqa: B008
    days: float | None = typer.Option(None, "--retention-days", help=DAYS_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Retire the finished trajectories past their retention: one whole walk, now."""
    with fleet_redis() as (settings, client):
        config = fleet_config.require(client, settings.key_prefix).admission
        keep = retention_by_tenant(config, tenant, days, settings.retention_days)
        store = RedisStore(client, prefix=settings.key_prefix)
        sweep = RetentionSweep(store, tuple(keep), keep.__getitem__, time.time, every_s=0)
        retired: Counter[str] = Counter({t: 0 for t in keep})
        while sweep.laps == 0:
            retired.update(t for t, _ in sweep.sweep())
    if as_json:
        sys.stdout.write(json.dumps({"retired": dict(retired)}, sort_keys=True) + "\n")
        return
    for name, n in retired.items():
        console.print(f"{name}: {n:,} finished trajectories retired")


def archive_cmd(
    directory: Path = typer.Argument(..., help="a writable directory (object path prefix)"),  # noqa: B008
    tenant: list[str] = typer.Option([], "--tenant", help=TENANT_HELP),  # noqa: B008
    days: float | None = typer.Option(None, "--retention-days", help=DAYS_HELP),
    retire: bool = typer.Option(False, "--retire", help="retire each once its file is synced"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Write the finished trajectories past their retention (record and chain, one JSON line
    each) to a new file per tenant; with --retire, then retire them."""
    check_directory(directory)
    with fleet_redis() as (settings, client):
        config = fleet_config.require(client, settings.key_prefix).admission
        keep = retention_by_tenant(config, tenant, days, settings.retention_days)
        store = RedisStore(client, prefix=settings.key_prefix)
        done = archive(store, keep, directory, now=time.time(), retire=retire)
    if as_json:
        sys.stdout.write(json.dumps({"archives": [a.as_json() for a in done]}) + "\n")
        return
    for a in done:
        where = a.path or "(nothing due: no file)"
        console.print(f"{a.tenant}: {a.written:,} written to {where}, {a.retired:,} retired")


def register(app: typer.Typer) -> None:
    """Attach ``reins retire`` and ``reins archive`` to the CLI."""
    app.command("retire")(retire_cmd)
    app.command("archive")(archive_cmd)
