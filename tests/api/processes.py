"""The fleet's real processes behind the API: workers, a router and the API process, all on
this test's key prefix, the router reading the fleet's document from Redis."""

from __future__ import annotations

import socket

import httpx

from ops.local.fleet import LocalFleet
from tests.conftest import REDIS_URL
from tests.support import wait_for

BACKEND = "ops.cli.fleet:support_store_redis"


def fleet_env(prefix: str) -> dict[str, str]:
    """Settings of the processes: no tenants file (the document in Redis), fast heartbeats."""
    return {
        "REINS_KEY_PREFIX": prefix,
        "REINS_REDIS_URL": REDIS_URL,
        "REINS_BROKER_URL": REDIS_URL,
        "REINS_HEARTBEAT_INTERVAL_S": "0.25",
        "REINS_HEARTBEAT_TIMEOUT_S": "3",
        "REINS_SCRIPTED_LATENCY_S": "0",
        "REINS_WORKER_CONCURRENCY": "16",
        "REINS_DRAIN_GRACE_S": "5",
        "REINS_VISIBILITY_TIMEOUT_S": "4",
        "REINS_MAX_TURN_S": "3",
        "REINS_STALL_TIMEOUT_S": "30",
    }


def free_port() -> int:
    """A port nothing listens on now, on the loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_api(fleet: LocalFleet, name: str = "api", env: dict[str, str] | None = None) -> str:
    """Start the API process on a free loopback port (``env``: more settings of its own); its
    base URL once it is ready."""
    port = free_port()
    where = ("--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING")
    fleet.start("api", name, *where, env=env)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        fleet._check_alive()
        try:
            return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 60, "the API to be ready")
    return url


def start_fleet(
    fleet: LocalFleet,
    workers: tuple[str, ...] = ("w1", "w2"),
    api_env: dict[str, str] | None = None,
) -> str:
    """Workers, one router and the API (``api_env``: more settings of its own); the API's
    URL."""
    for w in workers:
        fleet.start("worker", w, "--backend", BACKEND)
    fleet.start("router", "r1", "--admitter", "redis")
    url = start_api(fleet, env=api_env)
    fleet.wait_ready(list(workers), ["r1"])
    return url
