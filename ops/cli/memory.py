"""``reins memory ls|rm|export``: the tenant's facts and episodes, through the API."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from kernel.errors import InvalidInput
from ops.cli.api_target import connected
from ops.cli.client import JSON, _print_json, console

memory_app = typer.Typer(
    help="Your tenant's facts and episodes: list them, delete them, export a user's."
)


@memory_app.command("ls")
def ls_cmd(
    kind: str | None = typer.Option(None, "--kind", help="fact or episode"),
    user: str | None = typer.Option(None, "--user", help="only the items that concern USER"),
    as_json: bool = JSON,
) -> None:
    """List your tenant's facts and episodes, newest first."""
    with connected() as client:
        page = client.memory(kind, user)
    if as_json:
        _print_json(page)
        return
    _table("memory", page["items"])


def _source(item: dict[str, Any]) -> str:
    prov = item.get("provenance")
    if not prov:
        return "reins"  # an episode: written by reins from the record
    calls = " ".join(prov.get("call_ids") or ())
    return f"{prov['source']} ({prov['trust']})" + (f" {calls}" if calls else "")


def _table(title: str, items: list[dict[str, Any]]) -> None:
    table = Table(title=title)
    for column in ("id", "kind", "scope", "subject", "key", "source", "value"):
        table.add_column(column)
    for i in items:
        value = str(i["value"])
        table.add_row(
            i["item_id"],
            i["kind"],
            i["scope"],
            i["subject"],
            i["key"],
            _source(i),
            value if len(value) <= 60 else value[:57] + "...",
        )
    console.print(table)


@memory_app.command("rm")
def rm_cmd(
    item_id: str | None = typer.Argument(None, help="the item to delete"),
    user: str | None = typer.Option(
        None, "--user", help="delete every item that concerns USER (an erasure request)"
    ),
    source: str | None = typer.Option(
        None, "--source", help="delete every fact the result of tool call CALL shaped"
    ),
    as_json: bool = JSON,
) -> None:
    """Delete one item, every item that concerns a user, or what one tool call's result wrote."""
    given = [x for x in (item_id, user, source) if x is not None]
    if len(given) != 1:
        raise InvalidInput(
            "reins memory rm: give one of ITEM_ID, --user USER or --source CALL, not both",
            field="item_id",
        )
    with connected() as client:
        if user is not None:
            done = client.erase_user(user)
        elif source is not None:
            done = client.erase_source(source)
        else:
            assert item_id is not None
            client.forget(item_id)
            done = {"item_id": item_id, "deleted": 1}
    if as_json:
        _print_json(done)
        return
    console.print(f"deleted {done['deleted']} item(s)")
    if done.get("items"):
        _table("deleted", done["items"])


@memory_app.command("export")
def export_cmd(
    user: str = typer.Option(..., "--user", help="the user whose data to export"),
) -> None:
    """Everything your tenant's memory holds about a user, as JSON (facts, episodes, and the
    trajectories they came from)."""
    with connected() as client:
        _print_json(client.export_user(user))
