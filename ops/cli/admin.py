"""``reins keys create|list|revoke`` and ``reins config apply|show``: the fleet's administration,
straight on its Redis (``REINS_REDIS_URL``, ``REINS_KEY_PREFIX``); an operator runs these."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

import typer
from rich.console import Console
from rich.table import Table

from api.keys import KeyRing, Scope, grant_summary
from kernel.errors import InvalidInput
from ops.cli.connect import fleet_redis
from router.fleet import config as fleet_config
from router.fleet.routes import RouteTable
from worker.providers.keys import KeyRef

keys_app = typer.Typer(no_args_is_help=True, help="API keys: create, list, revoke.")
config_app = typer.Typer(no_args_is_help=True, help="The fleet's configuration in Redis.")
console = Console()


def _scopes(raw: list[str]) -> set[Scope]:
    try:
        return {Scope(s) for part in raw for s in part.split(",") if s}
    except ValueError:
        known = ", ".join(s.value for s in Scope)
        raise InvalidInput(f"unknown scope in {raw}; known: {known}") from None


@keys_app.command("create")
def create_cmd(
    tenant: str | None = typer.Option(None, "--tenant", help="the tenant (none: operator key)"),
    principal: str = typer.Option(..., "--principal", help="who uses it (reviewer name, ...)"),
    scope: list[str] = typer.Option(  # noqa: B008 - typer's idiom
        ["submit,read,control"], "--scope", help="submit, read, control, decide, operator"
    ),
    note: str = typer.Option("", "--note", help="a note shown in listings"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Create an API key; it is printed once and stored only as its hash."""
    with fleet_redis() as (settings, client):
        key, grant = KeyRing(client, settings.key_prefix).create(
            tenant, principal, _scopes(scope), note
        )
    if as_json:
        sys.stdout.write(json.dumps({"key": key, **grant_summary(grant)}) + "\n")
        return
    console.print(f"key {grant.key_id} for {tenant or 'the fleet (operator)'}: [bold]{key}[/]")
    console.print("store it now: it is not shown again. export REINS_API_KEY=<key>")


@keys_app.command("list")
def list_cmd(as_json: bool = typer.Option(False, "--json", help="print one JSON object")) -> None:
    """Every live key: id, tenant, principal, scopes (never the key)."""
    with fleet_redis() as (settings, client):
        grants = [grant_summary(g) for g in KeyRing(client, settings.key_prefix).grants()]
    if as_json:
        sys.stdout.write(json.dumps({"keys": grants}) + "\n")
        return
    table = Table(title="API keys")
    for column in ("key id", "tenant", "principal", "scopes", "note"):
        table.add_column(column)
    for g in grants:
        scopes = ",".join(g["scopes"])
        table.add_row(g["key_id"], g["tenant"] or "(operator)", g["principal"], scopes, g["note"])
    console.print(table)


@keys_app.command("revoke")
def revoke_cmd(key_id: str = typer.Argument(..., help="the key id (reins keys list)")) -> None:
    """Revoke a key: its next request is refused."""
    with fleet_redis() as (settings, client):
        if not KeyRing(client, settings.key_prefix).revoke(key_id):
            raise InvalidInput(f"no key {key_id!r}; reins keys list shows the live ones")
    console.print(f"key {key_id} revoked")


@config_app.command("apply")
def apply_cmd(
    path: str = typer.Argument(..., help="the fleet document, .toml or .json"),
    gates: str | None = typer.Option(
        None, "--gates", help="a gates file (routes) to apply as the document's gates"
    ),
) -> None:
    """Validate FILE and store it as the fleet's next configuration version.

    A route whose key reference does not resolve here is applied with a warning: the workers
    resolve it, and this machine need not hold the keys."""
    data = fleet_config.read_file(path)
    if gates:
        data["gates"] = fleet_config.read_file(gates)
    fleet_config.parse_document(data)  # refused here, naming the field, before any warning
    for warning in key_warnings(fleet_config.parse_routes(data), os.environ):
        Console(stderr=True).print(f"[yellow]warning:[/] {warning}", highlight=False)
    with fleet_redis() as (settings, client):
        version = fleet_config.apply(client, settings.key_prefix, data)
    console.print(
        f"fleet configuration v{version} applied; the API and workers read it within seconds, "
        "routers at their next start"
    )


@config_app.command("show")
def show_cmd() -> None:
    """Print the configuration in force (one JSON object)."""
    with fleet_redis() as (settings, client):
        fleet = fleet_config.require(client, settings.key_prefix)
    out = {
        "version": fleet.version,
        "tenants": json.loads(fleet.admission.model_dump_json())["tenants"],
        "gates": None if fleet.gates is None else json.loads(fleet.gates.model_dump_json()),
        "authority": json.loads(fleet.authority.model_dump_json())["tenants"],
        "models": {  # routes name their keys' variables or files, never a key
            name: json.loads(entry.model_dump_json(exclude_none=True))
            for name, entry in fleet.routes.models.items()
        },
    }
    sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")


def key_warnings(routes: RouteTable, env: Mapping[str, str]) -> list[str]:
    """What of each route's key reference does not resolve with ``env`` (never a key)."""
    out = []
    for model, entry in routes.models.items():
        for route in entry.routes:
            problem = KeyRef(route.api_key_env, route.api_key_file).problem(env)
            if problem:
                out.append(
                    f"models.{model}.routes[{route.name!r}]: {problem} on this machine "
                    "(each worker resolves it)"
                )
    return out


def register(app: typer.Typer) -> None:
    """Attach ``keys`` and ``config`` to the CLI."""
    app.add_typer(keys_app, name="keys")
    app.add_typer(config_app, name="config")
