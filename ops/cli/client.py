"""The CLI's client commands, on the API (``REINS_API_URL``, ``REINS_API_KEY``): submit, ls,
show, events, approvals, approve, deny, pause, resume, cancel, kill, interrupt, top. With
neither variable set, approve, deny and the controls act on the embedded store instead
(:mod:`ops.cli.embedded_control`).

Tables for people, ``--json`` for scripts (one JSON object per line). A refusal prints the
API's problem: what was wrong, with which field, and what to do.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from api.client import ReinsClient
from kernel.errors import InvalidInput
from kernel.record import ControlKind
from ops.cli import api_target, embedded_control
from ops.cli.api_target import connected
from ops.cli.top import top_cmd

console = Console()
JSON = typer.Option(False, "--json", help="print JSON for scripts")


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")


def _follow(client: ReinsClient, tid: str, as_json: bool) -> None:
    for event in client.events(tid):
        if as_json:
            _print_json({"id": event.id, "event": event.kind, "data": event.data})
            continue
        row = event.data
        what = row.get("tool") or row.get("outcome") or ""
        console.print(f"[dim]{event.id:>3}[/] {event.kind:<8} {what} {row.get('error') or ''}")
    shown = client.show(tid)
    if not as_json:
        console.print(f"{tid}: {shown['state']} ({shown['stop_reason']})")
        if shown["closing_message"]:
            console.print(shown["closing_message"])


def submit_cmd(
    agent: str = typer.Option(..., "--agent", help="MODULE:AGENT, on your tenant's allow-list"),
    goal: str = typer.Option(..., "--goal", help="what the user asked for"),
    user: str = typer.Option("cu_ana", "--user", help="the user the run acts for"),
    budget: list[str] = typer.Option(  # noqa: B008 - typer's idiom
        [], "--budget", help="override a budget key: --budget max_steps=3 (repeatable)"
    ),
    idempotency_key: str | None = typer.Option(
        None, "--idempotency-key", help="the same key and job name the same trajectory"
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="stream its events to the stop"),
    tenant: str | None = typer.Option(
        None, "--tenant", help="without REINS_API_URL: submit in process for this tenant"
    ),
    as_json: bool = JSON,
) -> None:
    """Submit a job and print its trajectory id (through the API when REINS_API_URL is set)."""
    overrides = dict(pair.split("=", 1) for pair in budget if "=" in pair)
    if api_target.current() is None:
        if tenant is None:
            api_target.require()  # says what to set
        from ops.cli.fleet import submit_direct

        submit_direct(tenant or "", agent, goal, user, overrides)
        return
    job = {"agent": agent, "goal": goal, "user": user, "budget": overrides}
    with connected() as client:
        done = client.submit(job, idempotency_key=idempotency_key)
        if as_json:
            _print_json(done)
        else:
            console.print(f"submitted {done['trajectory_id']}")
        if follow:
            _follow(client, done["trajectory_id"], as_json)
        elif not as_json:
            console.print(f"next: reins events {done['trajectory_id']} -f")


def _trajectory_table(items: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for column in ("trajectory", "state", "v", "agent", "stop reason", "steps", "dollars"):
        table.add_column(column)
    for t in items:
        dollars = t["budget"]["dollars"]
        table.add_row(
            t["trajectory_id"],
            t["state"],
            str(t["version"]),
            t["agent"],
            t["stop_reason"] or "",
            f"{t['budget']['steps']['spent']}/{t['budget']['steps']['allowance']}",
            f"{dollars['spent']}/{dollars['allowance']}",
        )
    return table


def ls_cmd(
    state: str | None = typer.Option(None, "--state", help="only this state, e.g. READY"),
    limit: int = typer.Option(50, "--limit", help="at most this many"),
    cursor: str | None = typer.Option(None, "--cursor", help="from a previous page"),
    as_json: bool = JSON,
) -> None:
    """List your tenant's trajectories."""
    with connected() as client:
        page = client.trajectories(state, limit, cursor)
    if as_json:
        _print_json(page)
        return
    console.print(_trajectory_table(page["items"], "trajectories"))
    if page["next_cursor"]:
        console.print(f"more: reins ls --cursor {page['next_cursor']}")


def show_cmd(trajectory_id: str = typer.Argument(...), as_json: bool = JSON) -> None:
    """One trajectory: state, stop reason, spend, held approval."""
    with connected() as client:
        shown = client.show(trajectory_id)
    if as_json:
        _print_json(shown)
        return
    print_shown(shown)


def print_shown(shown: dict[str, Any]) -> None:
    """``reins show``'s table and notes for one trajectory as the API shows it."""
    trajectory_id = shown["trajectory_id"]
    console.print(_trajectory_table([shown], trajectory_id))
    held = shown["held_approval"]
    if held and held["status"] == "approved" and shown["state"] == "AWAITING_APPROVAL":
        console.print(
            f"approved, not admitted yet: {held['tool']} {json.dumps(held['arguments'])} "
            "(re-checked until it runs or its approval expires)"
        )
    elif held:
        why = held.get("reason", "approval")
        waits = "for a reviewer" if why == "approval" else f"until the operator lifts: {why}"
        console.print(f"held {waits}: {held['tool']} {json.dumps(held['arguments'])}")
        console.print(f"next: reins approve {trajectory_id}  (or reins deny {trajectory_id})")
    for wait in shown.get("waiting", ()):
        console.print(f"waiting: {wait['tool']} ({wait['call_id']}) for capacity on {wait['on']}")
    if shown["closing_message"]:
        console.print(shown["closing_message"])


def events_cmd(
    trajectory_id: str = typer.Argument(...),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep streaming until the stop"),
    as_json: bool = JSON,
) -> None:
    """Its execution chain as events (with -f, until the run stops)."""
    with connected() as client:
        if follow:
            _follow(client, trajectory_id, as_json)
            return
        for event in client.events(trajectory_id, follow=False):
            if as_json:
                _print_json({"id": event.id, "event": event.kind, "data": event.data})
            else:
                console.print(f"{event.id:>3} {event.kind:<8} {event.data.get('tool') or ''}")


def approvals_cmd(as_json: bool = JSON) -> None:
    """Approvals held in your tenant."""
    with connected() as client:
        held = client.approvals()["items"]
    if as_json:
        _print_json({"items": held})
        return
    table = Table(title="held approvals")
    for column in ("trajectory", "tool", "arguments", "expires at"):
        table.add_column(column)
    for h in held:
        table.add_row(
            h["trajectory_id"], h["tool"], json.dumps(h["arguments"]), f"{h['expires_at']:.0f}"
        )
    console.print(table)
    if held:
        console.print(f"next: reins approve {held[0]['trajectory_id']}")


TENANT = typer.Option(
    "default", "--tenant", help="without REINS_API_URL: the tenant in the embedded store"
)
APPROVAL = typer.Option(
    None, "--approval", help="the approval id it must hold (refused if it holds another)"
)
REVIEWER = typer.Option(
    "reviewer",
    "--reviewer",
    help="without REINS_API_URL: who decides, one of the agent's reviewers (the API: your key)",
)


def _decide(trajectory_id: str, approve: bool, approval_id: str | None, as_json: bool) -> None:
    with connected() as client:
        held = client.show(trajectory_id)["held_approval"]
        if held is None or held["status"] != "held":
            raise InvalidInput(
                f"{trajectory_id} holds no approval now; reins approvals lists those held"
            )
        done = client.decide(
            trajectory_id,
            approval_id or held["approval_id"],
            approve=approve,
            version=held["version"],
            digest=held["digest"],
        )
    if as_json:
        _print_json(done)
        return
    verb = "approved" if approve else "denied"
    console.print(f"{verb} {held['tool']} {json.dumps(held['arguments'])}: now {done['state']}")


def _decision(approve: bool) -> Any:
    def command(
        trajectory_id: str = typer.Argument(...),
        approval_id: str | None = APPROVAL,
        tenant: str = TENANT,
        reviewer: str = REVIEWER,
        as_json: bool = JSON,
    ) -> None:
        if not api_target.absent():
            _decide(trajectory_id, approve, approval_id, as_json)
            return
        embedded_control.decide(
            trajectory_id,
            tenant,
            approve=approve,
            approval_id=approval_id,
            reviewer=reviewer,
            as_json=as_json,
        )

    command.__doc__ = (
        "Approve the action the trajectory holds (as shown by reins show); without an API, on "
        "the embedded store, and the run goes on to its end or its next suspension."
        if approve
        else "Deny the action the trajectory holds; without an API, on the embedded store, and "
        "the run goes on as the kernel decides."
    )
    return command


def _control(kind: ControlKind) -> Any:
    def command(
        trajectory_id: str = typer.Argument(...), tenant: str = TENANT, as_json: bool = JSON
    ) -> None:
        if api_target.absent():
            embedded_control.control(trajectory_id, tenant, kind, as_json)
            return
        with connected() as client:
            done = client.control(trajectory_id, kind.value)
        if as_json:
            _print_json(done)
        else:
            console.print(f"{kind}: {trajectory_id} now {done['state']} (v{done['version']})")

    command.__doc__ = (
        f"{kind.value.capitalize()} a trajectory (without an API, one in the embedded store)."
    )
    return command


def register(app: typer.Typer) -> None:
    """Attach the client commands."""
    app.command("submit")(submit_cmd)
    app.command("ls")(ls_cmd)
    app.command("show")(show_cmd)
    app.command("events")(events_cmd)
    app.command("approvals")(approvals_cmd)
    app.command("approve")(_decision(approve=True))
    app.command("deny")(_decision(approve=False))
    for kind in ControlKind:
        app.command(kind.value)(_control(kind))

    app.command("top")(top_cmd)
