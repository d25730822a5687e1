"""``reins memory ls|rm``: the tenant's facts and episodes, through the API."""

from __future__ import annotations

import typer
from rich.table import Table

from kernel.errors import InvalidInput
from ops.cli.api_target import connected
from ops.cli.client import JSON, _print_json, console

memory_app = typer.Typer(help="Your tenant's facts and episodes: list them, delete them.")


@memory_app.command("ls")
def ls_cmd(
    kind: str | None = typer.Option(None, "--kind", help="fact or episode"),
    user: str | None = typer.Option(None, "--user", help="only this user's own items"),
    as_json: bool = JSON,
) -> None:
    """List your tenant's facts and episodes, newest first."""
    with connected() as client:
        page = client.memory(kind, user)
    if as_json:
        _print_json(page)
        return
    table = Table(title="memory")
    for column in ("id", "kind", "scope", "subject", "key", "tags", "value"):
        table.add_column(column)
    for i in page["items"]:
        value = str(i["value"])
        table.add_row(
            i["item_id"],
            i["kind"],
            i["scope"],
            i["subject"],
            i["key"],
            " ".join(i["tags"]),
            value if len(value) <= 60 else value[:57] + "...",
        )
    console.print(table)


@memory_app.command("rm")
def rm_cmd(
    item_id: str | None = typer.Argument(None, help="the item to delete"),
    user: str | None = typer.Option(None, "--user", help="delete all of this user's own items"),
    as_json: bool = JSON,
) -> None:
    """Delete one item, or every item in a user's own scope (an erasure request)."""
    if (item_id is None) == (user is None):
        raise InvalidInput("reins memory rm: give an ITEM_ID or --user USER, not both")
    with connected() as client:
        if user is not None:
            done = client.erase_user(user)
        else:
            assert item_id is not None
            client.forget(item_id)
            done = {"item_id": item_id, "deleted": 1}
    if as_json:
        _print_json(done)
    else:
        console.print(f"deleted {done['deleted']} item(s)")
