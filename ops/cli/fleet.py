"""``reins worker``, ``reins router``, ``reins api`` and ``reins control``: the fleet.

Each process reads the one settings object from ``REINS_*`` variables (the Redis of the store,
the broker, the key prefix, heartbeats, concurrency, drain grace); options below override
what only that process needs. A worker or router with ``REINS_METRICS_PORT`` set serves
Prometheus metrics there for as long as it runs (:func:`ops.observability.metrics.served`). Run as
``python -m ops.cli.fleet ...`` too (tests, the bench).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, cast

import redis
import typer

from kernel.agent import AgentModule
from kernel.settings import Settings
from kernel.tools import ToolBackend

LOG_LEVEL = typer.Option("INFO", "--log-level", help="level of reins's own log lines")


def _settings(**updates: Any) -> Settings:
    settings = Settings.from_env(os.environ)
    changes = {k: v for k, v in updates.items() if v is not None}
    return settings.model_copy(update=changes) if changes else settings


def worker_cmd(
    name: str = typer.Option(..., "--name", help="ring member name; the queue is named after it"),
    weight: float = typer.Option(1.0, "--weight", help="ring weight"),
    concurrency: int | None = typer.Option(None, "--concurrency", help="turns held at once"),
    provider: str | None = typer.Option(None, "--provider", help="model provider for every agent"),
    base_url: str | None = typer.Option(None, "--base-url", help="the provider's base URL"),
    model_name: str | None = typer.Option(None, "--model", help="the model name to ask for"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="variable with the key"),
    model_latency_s: float | None = typer.Option(
        None, "--model-latency-s", help="scripted models: seconds each call really takes"
    ),
    backend: str | None = typer.Option(
        None, "--backend", help="MODULE:FACTORY building the shared tool backend"
    ),
    log_level: str = LOG_LEVEL,
) -> None:
    """Run a fleet worker: consume this member's queue until SIGTERM (then drain)."""
    from ops.observability.metrics import served
    from ops.observability.tracing import observing, traced
    from router.fleet.agents import load_factory
    from worker.fleet import WorkerOptions, configure_logging, run_worker
    from worker.fleet_agents import ModelOverrides
    from worker.turn import TurnObserver

    settings = _settings(worker_concurrency=concurrency, scripted_latency_s=model_latency_s)
    configure_logging(name, log_level)
    overrides = ModelOverrides(
        provider=provider,
        base_url=base_url,
        name=model_name,
        api_key_env=api_key_env,
        scripted_latency_s=settings.scripted_latency_s,
    )
    options = WorkerOptions(
        name=name,
        weight=weight,
        overrides=overrides,
        backend=load_factory(backend) if backend else None,
    )
    with served(settings) as metrics, traced(os.environ, "reins-worker", name) as tracer:
        if metrics is not None:  # every tenant's series from 0
            metrics.on_worker(name)
            config = _tenants(settings)
            if config is not None:
                metrics.on_config(config)
        code = run_worker(
            settings,
            options,
            observer=observing(TurnObserver, cast(TurnObserver | None, metrics), tracer),
        )
    raise typer.Exit(code)


def _tenants(settings: Settings) -> Any:
    """The tenants of the fleet's document, ``settings``'s tenants file applied as it first
    (None: no document and no file)."""
    from router.fleet import config as fleet_config
    from store.redis_client import client_for

    client = client_for(settings)
    try:
        if settings.tenants_file:  # applied as the document at boot (fleet_config.apply_file)
            fleet_config.apply_file(client, settings.key_prefix, settings.tenants_file)
        fleet = fleet_config.load(client, settings.key_prefix)
    finally:
        client.close()
    return None if fleet is None else fleet.admission


def router_cmd(
    name: str = typer.Option(..., "--name", help="this router replica's name"),
    tenants: str | None = typer.Option(
        None, "--tenants", help="a fleet document to apply at boot (as reins config apply)"
    ),
    gates: str = typer.Option("", "--gates", help="provider gate configuration file"),
    admitter: str = typer.Option("redis", "--admitter", help="redis (shared), drr or fifo"),
    claim_ttl_s: float = typer.Option(30.0, "--claim-ttl-s", help="claims older are reaped"),
    log_level: str = LOG_LEVEL,
) -> None:
    """Run a router: ring, ready feed and dispatch loop, until SIGTERM."""
    from ops.observability.metrics import served
    from ops.observability.tracing import observing, traced
    from router.fleet.observe import RouterObserver
    from router.process.service import AdmitterKind, RouterOptions, RouterService
    from worker.fleet import configure_logging

    settings = _settings(tenants_file=tenants)
    configure_logging(name, log_level)
    options = RouterOptions(
        name=name,
        tenants_file=settings.tenants_file,
        gates_file=gates,
        admitter=AdmitterKind(admitter),
        claim_ttl_s=claim_ttl_s,
    )
    with served(settings) as metrics, traced(os.environ, "reins-router", name) as tracer:
        observer = observing(RouterObserver, cast(RouterObserver | None, metrics), tracer)
        service = RouterService(settings, options, observer=observer)
        code = service.run()
    raise typer.Exit(code)


def api_cmd(
    name: str = typer.Option("api", "--name", help="this API process's name (its log lines)"),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8080, "--port", help="port to listen on"),
    workers: int = typer.Option(1, "--workers", min=1, help="processes accepting on the port"),
    log_level: str = LOG_LEVEL,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) until SIGTERM."""
    from api.app import create_app
    from api.serve import serve
    from worker.fleet import configure_logging

    settings = _settings()
    configure_logging(name, log_level)
    code = serve(lambda: create_app(settings), host, port, log_level, workers=workers)
    raise typer.Exit(code)


def _api() -> Any:
    """The router's functions as a trusted caller in this process uses them: over the fleet's
    document in Redis, never admitting and never writing configuration or gate limits (the
    API's own router API, :class:`api.front.Front`)."""
    from api.front import Front

    return Front.wire(_settings()).router_api()


def submit_direct(tenant: str, agent: str, goal: str, user: str, overrides: dict[str, str]) -> None:
    """Submit one job in this process, as a trusted caller of the router's functions (no API
    running); print its trajectory id as one JSON object."""
    job = {"agent": agent, "goal": goal, "user": user, "budget": overrides}
    done = _api().submit(tenant, job)
    out = {"tenant": done.tenant, "trajectory_id": done.trajectory_id}
    sys.stdout.write(json.dumps(out) + "\n")


def control_cmd(
    tenant: str = typer.Argument(..., help="the trajectory's tenant"),
    trajectory_id: str = typer.Argument(..., help="the trajectory"),
    kind: str = typer.Argument(..., help="pause, resume, cancel, kill or interrupt"),
    by: str = typer.Option("operator", "--by", help="who asks"),
) -> None:
    """An operator's control request, straight on the fleet's Redis (tenants use the API:
    reins pause|resume|cancel|kill ID); print the answer."""
    ack = _api().control(tenant, trajectory_id, kind, by)
    sys.stdout.write(json.dumps(ack, sort_keys=True) + "\n")


def support_store_redis(agent: AgentModule, settings: Settings, client: redis.Redis) -> ToolBackend:
    """The support store's backend on its Redis state: one service every worker shares.

    ``reins worker --backend ops.cli.fleet:support_store_redis``; the state lives under
    ``<REINS_KEY_PREFIX>:store`` and outlives any worker.
    """
    from examples.support_store.backend import SupportStoreBackend
    from examples.support_store.state import RedisState

    return SupportStoreBackend(RedisState(client, settings.key_prefix))


def register(app: typer.Typer) -> None:
    """Attach the fleet commands to the ``reins`` CLI."""
    app.command("worker")(worker_cmd)
    app.command("router")(router_cmd)
    app.command("api")(api_cmd)
    app.command("control")(control_cmd)


def main() -> None:
    """``python -m ops.cli.fleet``: the fleet commands alone."""
    app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
    register(app)
    app()


if __name__ == "__main__":
    main()
