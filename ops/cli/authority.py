"""``reins freeze`` and ``reins grants``: what operators allow a tenant or a trajectory.

A tenant's settings are the fleet's document (the next version, on its Redis, as ``reins config
apply`` writes it: ``REINS_REDIS_URL``, ``REINS_KEY_PREFIX``); a trajectory's go through the API
(``REINS_API_URL``, ``REINS_API_KEY``). A freeze holds writes, not sent, until it is lifted
(``--off``); a tool not granted is refused to the model. Bad input changes nothing.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

from kernel.errors import InvalidInput
from ops.cli.api_target import connected
from ops.cli.connect import fleet_redis
from router.fleet import config as fleet_config

console = Console()
TRAJECTORY = typer.Option(None, "--trajectory", help="a trajectory (through the API)")


def _target(tenant: str | None, trajectory: str | None) -> None:
    if (tenant is None) == (trajectory is None):
        raise InvalidInput("name a TENANT or --trajectory ID (one of them)")


def _edit_tenant(tenant: str, key: str, value: Any) -> int:
    def change(data: dict[str, Any]) -> None:
        fleet_config.tenant_settings(data, tenant)[key] = value

    with fleet_redis() as (settings, client):
        return fleet_config.edit(client, settings.key_prefix, change)


def freeze_cmd(
    tenant: str | None = typer.Argument(None, help="a tenant of the fleet's document"),
    trajectory: str | None = TRAJECTORY,
    off: bool = typer.Option(False, "--off", help="lift the freeze"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Freeze a tenant or a trajectory: its writes are held, not sent, until --off."""
    _target(tenant, trajectory)
    if trajectory is not None:
        with connected() as client:
            done = client.freeze(trajectory, frozen=not off)
        out = {"trajectory_id": trajectory, "frozen": not off, "state": done["state"]}
    else:
        assert tenant is not None
        version = _edit_tenant(tenant, "frozen", not off)
        out = {"tenant": tenant, "frozen": not off, "version": version}
    if as_json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    else:
        what = tenant or trajectory
        console.print(f"{what}: {'frozen' if not off else 'freeze lifted'}")


def grants_cmd(
    tenant: str | None = typer.Argument(None, help="a tenant of the fleet's document"),
    trajectory: str | None = TRAJECTORY,
    tools: str | None = typer.Option(None, "--tools", help="the tools allowed, a,b (none: all)"),
    read_only: bool = typer.Option(False, "--read-only", help="writes are held, not sent"),
    deny: list[str] = typer.Option(  # noqa: B008 - typer's idiom
        [], "--deny-target", help="a target no call may name (repeat for more)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Set the grants of a tenant or a trajectory: tools allowed, read-only, denied targets."""
    _target(tenant, trajectory)
    grants: dict[str, Any] = {"read_only": read_only, "denied_targets": deny}
    if tools is not None:
        grants["tools"] = [t for t in tools.split(",") if t]
    if trajectory is not None:
        with connected() as client:
            client.grants(trajectory, grants)
        out: dict[str, Any] = {"trajectory_id": trajectory, "grants": grants}
    else:
        assert tenant is not None
        out = {
            "tenant": tenant,
            "grants": grants,
            "version": _edit_tenant(tenant, "grants", grants),
        }
    if as_json:
        sys.stdout.write(json.dumps(out, sort_keys=True) + "\n")
    else:
        console.print(f"{tenant or trajectory}: grants {grants}")


def register(app: typer.Typer) -> None:
    """Attach ``freeze`` and ``grants``."""
    app.command("freeze")(freeze_cmd)
    app.command("grants")(grants_cmd)
