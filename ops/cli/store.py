"""``reins store``: the Redis store's own maintenance (``migrate`` from an older key layout)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import typer

from kernel.settings import Settings
from ops.cli.connect import fleet_redis
from store.redis_client import client_from_url
from store.redis_layout import migrate

store_app = typer.Typer(no_args_is_help=True, help="The Redis store: migrate its key layout.")


@store_app.command("migrate")
def migrate_cmd(
    source_url: str = typer.Option(
        "", "--from", help="the Redis holding the old layout (default: REINS_REDIS_URL itself)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Move a store written in key layout 1 to this build's layout (on REINS_REDIS_URL, under
    REINS_KEY_PREFIX). Stop every reins process on the store first; running it again after a
    failure is safe. In place, the old keys are deleted once copied; from another Redis, the
    source is left as it was."""
    settings = Settings.from_env(os.environ)
    with fleet_redis(settings) as (_, target):
        if not source_url or source_url == settings.redis_url:
            done = migrate(target, target, settings.key_prefix, same=True)
        else:
            source = client_from_url(source_url, setting="--from")
            try:
                done = migrate(source, target, settings.key_prefix, same=False)
            finally:
                source.close()
    figures = asdict(done)
    figures["deleted"] = len(done.deleted)
    if as_json:
        typer.echo(json.dumps(figures, sort_keys=True))
        return
    for name, value in figures.items():
        typer.echo(f"{name}: {value}")
