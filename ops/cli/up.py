"""``reins up``: a development fleet on this machine, in one command.

It starts a Redis if none answers (and ``redis-server`` is on the PATH), applies the examples'
fleet configuration (or ``--config FILE``), starts a router, the API and two workers (each
logging to ``.reins/logs/<name>.log``), writes an operator key and a key per tenant to
``.reins/keys`` and the PIDs it started to ``.reins/pids``, prints the URL and the next command,
and waits. On Ctrl-C (or SIGTERM) it stops what it started, by PID: the API, then the workers
(they drain), then the router, then the Redis it started.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO, Any

import httpx
import redis
import typer
from rich.console import Console

from api.keys import TENANT_SCOPES, KeyRing, Scope
from kernel.errors import ConfigError
from kernel.settings import Settings
from ops.local.fleet import ROOT, LocalFleet, wait_for
from router.fleet import config as fleet_config

console = Console()
EXAMPLE_CONFIG = ROOT / "examples" / "fleet.toml"
BACKEND = "ops.cli.fleet:support_store_redis"


def _redis_answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class DevFleet:
    """What ``reins up`` started; see the module docstring."""

    def __init__(self, home: Path, settings: Settings, port: int, workers: int) -> None:
        self.home, self.settings, self.port, self.workers = home, settings, port, workers
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.client = redis.Redis.from_url(settings.redis_url)
        self.redis: subprocess.Popen[bytes] | None = None
        self._redis_log: IO[bytes] | None = None
        env = {
            "REINS_KEY_PREFIX": settings.key_prefix,
            "REINS_REDIS_URL": settings.redis_url,
            "REINS_BROKER_URL": settings.broker_url,
            "REINS_SCRIPTED_LATENCY_S": "0.2",
        }
        self.fleet = LocalFleet(env, self.logs, self.client)
        self.url = f"http://127.0.0.1:{port}"

    def ensure_redis(self) -> None:
        """A Redis that answers: the one running, or one started here."""
        if _redis_answers(self.client):
            return
        binary = shutil.which("redis-server")
        if binary is None:
            raise ConfigError(
                f"no Redis answers at {self.settings.redis_url} and redis-server is not on the "
                "PATH: install it (apt-get install redis-server) or set REINS_REDIS_URL"
            )
        port = self.client.connection_pool.connection_kwargs.get("port", 6379)
        self._redis_log = open(self.logs / "redis.log", "ab")  # noqa: SIM115 - kept open
        self.redis = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=self._redis_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        wait_for(lambda: _redis_answers(self.client), 20, "the Redis started here")

    def configure(self, config: Path) -> dict[str, str]:
        """Apply the fleet's document and write keys: an operator's and one per tenant."""
        data = fleet_config.read_file(config)
        version = fleet_config.apply(self.client, self.settings.key_prefix, data)
        admission, _ = fleet_config.parse_document(data)
        ring = KeyRing(self.client, self.settings.key_prefix)
        keys = {"operator": ring.create(None, "operator", {Scope.OPERATOR}, "reins up")[0]}
        for tenant in admission.tenants:
            keys[tenant.name] = ring.create(tenant.name, "reviewer", TENANT_SCOPES, "reins up")[0]
        path = self.home / "keys"
        path.write_text(json.dumps({"url": self.url, "keys": keys}, indent=2) + "\n")
        path.chmod(0o600)
        console.print(f"fleet configuration v{version} applied from {config}")
        return keys

    def start(self) -> None:
        """The router, the API and the workers; until the API is ready and the ring holds them."""
        names = [f"w{i + 1}" for i in range(self.workers)]
        self.fleet.start("router", "router", "--log-level", "WARNING")
        self.fleet.start("api", "api", "--port", str(self.port), "--log-level", "WARNING")
        for name in names:
            self.fleet.start("worker", name, "--backend", BACKEND, "--log-level", "WARNING")
        self.fleet.wait_ready(names, ["router"])
        wait_for(self._api_ready, 60, f"the API on {self.url}")
        pids = {name: proc.pid for name, proc in self.fleet.procs.items()}
        if self.redis is not None:
            pids["redis"] = self.redis.pid
        (self.home / "pids").write_text(json.dumps(pids, indent=2) + "\n")

    def _api_ready(self) -> bool:
        self.fleet._check_alive()
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> dict[str, int]:
        """Stop everything started here, by PID: API, workers (drain), router, Redis."""
        codes: dict[str, int] = {}
        order = ["api", *sorted(n for n in self.fleet.procs if n.startswith("w")), "router"]
        for name in order:
            if name in self.fleet.procs:
                codes[name] = self.fleet.stop(name)
        self.fleet.close()
        if self.redis is not None:
            self.redis.terminate()
            codes["redis"] = self.redis.wait(timeout=30)
        if self._redis_log is not None:
            self._redis_log.close()
        self.client.close()
        return codes


def _next_steps(url: str, keys: dict[str, str], home: Path) -> None:
    tenant = next(name for name in keys if name != "operator")
    console.print(f"\n[bold]reins is up[/] at {url} (OpenAPI: {url}/docs); logs in {home}/logs")
    console.print(f"keys in {home}/keys. As tenant {tenant}:\n")
    # Commands to copy: never wrapped at the terminal's width (a wrapped line breaks them).
    console.print(f"  export REINS_API_URL={url} REINS_API_KEY={keys[tenant]}", soft_wrap=True)
    console.print(
        '  reins submit --agent examples.support_store:agent --goal "refund the damaged item '
        'on order ord_1001" --follow\n',
        soft_wrap=True,
    )
    console.print(f"The console: {url}/ui (sign in with the same key).")
    console.print("Ctrl-C stops everything started here.")


def up_cmd(
    port: int = typer.Option(8080, "--port", help="the API's port on 127.0.0.1"),
    workers: int = typer.Option(2, "--workers", min=1, help="worker processes"),
    config: Path = typer.Option(  # noqa: B008 - typer's idiom
        EXAMPLE_CONFIG, "--config", help="the fleet's document to apply"
    ),
    home: Path = typer.Option(Path(".reins"), "--home", help="where logs, keys and pids go"),  # noqa: B008
) -> None:
    """Bring up a development fleet here: Redis if needed, a router, the API, two workers."""
    settings = Settings.from_env(os.environ)
    dev = DevFleet(home, settings, port, workers)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        dev.ensure_redis()
        keys = dev.configure(config)
        dev.start()
        _next_steps(dev.url, keys, home)
        while not stop.wait(0.5):
            dev.fleet._check_alive()
    finally:
        console.print("stopping: the API, the workers (draining), the router ...")
        codes = dev.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        console.print(f"[red]exited with errors:[/] {failed}; see {home}/logs")
        raise SystemExit(1)
    console.print("stopped")


def register(app: typer.Typer) -> None:
    """Attach ``up``."""
    app.command("up")(up_cmd)
