"""The ``reins`` command line: a fleet through its API (submit, ls, show, events, approve, top),
its processes (up, api, router, worker), its administration (keys, config, ring, doctor), and
the embedded runner (run, demo, trace, replay); benchmarks."""

from __future__ import annotations

import json
import signal
import sys
from contextlib import nullcontext

import typer
from rich.console import Console
from rich.table import Table

from kernel.errors import ReinsError
from ops import bench as benchmarks

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
console = Console()
err_console = Console(stderr=True)


def _print_version(wanted: bool) -> None:
    """``reins --version``: the installed distribution's version (pyproject's, the image's tag)."""
    if wanted:
        from importlib.metadata import version

        sys.stdout.write(f"reins {version('reins')}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version"
    ),
) -> None:
    """The options of ``reins`` itself, before any command."""


@app.command("bench")
def bench_cmd(
    name: str = typer.Argument(..., help="benchmark: " + ", ".join(benchmarks.BENCHMARKS)),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    quick: bool = typer.Option(False, "--quick", help="a smaller run, for a smoke test"),
    cluster: bool = typer.Option(
        False, "--cluster", help="store: on a three-master Redis Cluster the bench starts"
    ),
    trajectories: int | None = typer.Option(
        None, "--trajectories", help="bench scale: trajectories to simulate"
    ),
    broker: str | None = typer.Option(
        None, "--broker", help="fleet: the broker, redis (the default) or amqp (RabbitMQ)"
    ),
    minutes: float | None = typer.Option(
        None, "--minutes", help="soak: how long the load and its faults last"
    ),
) -> None:
    """Run one benchmark side by side with its peer and print the figures."""
    run = benchmarks.load(name)
    if trajectories is not None and trajectories < 1:
        raise typer.BadParameter(f"--trajectories must be at least 1, got {trajectories}")
    if minutes is not None and not 0.5 <= minutes <= 600:
        raise typer.BadParameter(f"--minutes must be between 0.5 and 600, got {minutes}")
    options = benchmarks.options(
        name, run, cluster=cluster, trajectories=trajectories, broker=broker, minutes=minutes
    )
    # A SIGTERM ends the run as Ctrl-C does, through its cleanup: the processes and the
    # redis-server a bench started are ended with it, not left running.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    progress = nullcontext() if as_json else console.status(f"running bench {name} ...")
    with progress:
        result = run(quick=quick, **options)
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
        return
    table = Table(title=f"reins bench {name}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:,.4g}" if isinstance(value, float) else str(value))
    console.print(table)


def _register_subcommands() -> None:
    """Attach the sub-applications; each lives in its own module."""
    from ops.cli import admin as cli_admin
    from ops.cli import authority as cli_authority
    from ops.cli import client as cli_client
    from ops.cli import doctor as cli_doctor
    from ops.cli import fleet as cli_fleet
    from ops.cli import run as cli_run
    from ops.cli import trace as cli_trace
    from ops.cli import up as cli_up

    cli_admin.register(app)
    cli_authority.register(app)
    cli_client.register(app)
    cli_up.register(app)
    cli_doctor.register(app)
    cli_fleet.register(app)
    cli_run.register(app)
    cli_trace.register(app)
    from ops.cli import limits as cli_limits
    from ops.cli import memory as cli_memory
    from ops.cli import retention as cli_retention
    from ops.cli import ring as cli_ring
    from ops.cli import store as cli_store

    app.add_typer(cli_ring.ring_app, name="ring")
    app.add_typer(cli_memory.memory_app, name="memory")
    app.add_typer(cli_store.store_app, name="store")
    cli_limits.register(app)
    cli_retention.register(app)


def main() -> None:
    """Entry point: run the CLI and turn reins errors into a one-line message and exit 2."""
    from ops.cli import api_target

    api_target.take()  # REINS_API_URL and REINS_API_KEY are the client's, not settings
    _register_subcommands()
    try:
        code = app(standalone_mode=False)
    except ReinsError as exc:
        err_console.print(f"[bold red]error:[/] {exc}")
        raise SystemExit(2) from None
    except typer.Abort:
        raise SystemExit(1) from None
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            raise SystemExit(exc.exit_code) from None
        raise
    if isinstance(code, int) and code:  # typer.Exit(code) in non-standalone mode returns it
        raise SystemExit(code)
