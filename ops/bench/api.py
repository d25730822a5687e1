"""``reins bench api``: submissions through the HTTP API beside the same submissions straight
through the router's in-process API, and how soon a commit's event reaches an SSE client.

One API process (``reins api``) on a free loopback port, the machine's Redis, a unique key
prefix (deleted afterwards). ``api_submits_per_s``: 8 client threads, each with its own
keep-alive connection, submit jobs; ``direct_submits_per_s``: 8 threads submit the same jobs through
:class:`router.process.submit.RouterApi` in this process; the two alternate over three rounds (the
machine is shared: a neighbour's load hits both alike), each figure is the median of its
rounds, and ``ratio`` the median of the rounds' quotients.
``event_p99_ms``: a client follows one trajectory's events while this process commits rows to
its chain, one every few milliseconds; each latency runs from the commit's reply to the event
reaching the client (both clocks in this process).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import redis

from api.client import ReinsClient
from api.keys import KeyRing, Scope
from kernel.chain import ChainRow, RowKind
from kernel.settings import Settings
from ops.bench.peers import Peer, reins_itself
from ops.local.fleet import LocalFleet, wait_for
from router.fleet import config as fleet_config
from router.process.submit import RouterApi
from router.wire.feed import Feed
from store.redis_store import RedisStore

AGENT = "examples.support_store:agent"
THREADS = 8
ROUNDS = 3  # API and direct phases, alternating; the ratio is the median of each round's
DOCUMENT = {
    "quantum_tokens": 1000,
    "credit_cap_tokens": 12000,
    "tenants": [
        {
            "name": "acme",
            "weight": 1,
            "max_ready": 1_000_000,
            "largest_call_tokens": 8000,
            "agents": [AGENT],
        }
    ],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _job(i: int) -> dict[str, Any]:
    return {"agent": AGENT, "goal": f"refund the damaged item on order ord_{i}", "user": "cu_ana"}


def _rate(count: int, submit_one: Any) -> float:
    """Submissions per second of ``count`` jobs over :data:`THREADS` threads."""
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(submit_one, range(count)))
    return count / (time.perf_counter() - start)


def _api_rate(port: int, key: str, count: int) -> float:
    """Each thread keeps one connection (``http.client``: the client's own cost stays small, so
    the figure is the API's; the typed httpx client costs the caller more CPU per request)."""
    local = threading.local()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    opened: list[http.client.HTTPConnection] = []

    def submit_one(i: int) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            opened.append(conn)
        conn.request("POST", "/v1/trajectories", body=json.dumps(_job(i)), headers=headers)
        reply = conn.getresponse()
        reply.read()
        if reply.status != 201:
            raise RuntimeError(f"submission refused: {reply.status}")

    try:
        return _rate(count, submit_one)
    finally:
        for conn in opened:
            conn.close()


def _direct_rate(client: redis.Redis, prefix: str, count: int) -> float:
    fleet = fleet_config.require(client, prefix)
    api = RouterApi(
        store=RedisStore(client, prefix=prefix),
        feed=Feed(client, prefix),
        config=fleet.admission,
        gate_config=fleet.gates,
    )
    api.agents.get(AGENT)  # imported once before timing, as the API process has it warm

    def submit_one(i: int) -> None:
        api.submit("acme", _job(i))

    return _rate(count, submit_one)


def _event_latencies(url: str, key: str, client: redis.Redis, prefix: str, n: int) -> list[float]:
    store = RedisStore(client, prefix=prefix)
    with ReinsClient(url, key) as api:
        tid = api.submit(_job(0))["trajectory_id"]
        arrived: dict[int, float] = {}
        opened = threading.Event()

        def follow() -> None:
            with ReinsClient(url, key) as reader:
                for event in reader.events(tid):
                    arrived[event.id] = time.perf_counter()
                    opened.set()

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        committed: dict[int, float] = {}
        for index in range(n + 1):
            committed[index] = _commit_row(store, tid, index, last=index == n)
            if index == 0:
                wait_for(opened.is_set, 30, "the event stream to open")
            time.sleep(0.004)
        reader.join(30)
    return [(arrived[i] - committed[i]) * 1000 for i in range(1, n + 1) if i in arrived]


def _commit_row(store: RedisStore, tid: str, index: int, last: bool) -> float:
    """Commit one chain row (a control row; the last a stop) and return when it was committed."""
    rec = store.load("acme", tid)
    row = ChainRow(
        trajectory_id=tid,
        tenant="acme",
        user=rec.user,
        index=index,
        step=0,
        kind=RowKind.STOP if last else RowKind.CONTROL,
        record_version=rec.record_version + 1,
        at=time.time(),
    )
    new = rec.model_copy(deep=True)
    new.record_version += 1
    new.chain_length = index + 1
    store.compare_and_set(new, rec.record_version, [row])
    return time.perf_counter()


def peer() -> Peer:
    """The router's in-process API: the same submissions without HTTP, auth and JSON."""
    return reins_itself(
        "router.process.submit.RouterApi",
        f"{THREADS} threads in the bench process submitting straight to the router's API on "
        "the same Redis: no HTTP, no auth, no JSON",
    )


def run(quick: bool = False) -> dict[str, Any]:
    """Start one API process, measure, end it, delete the keys."""
    base = Settings.from_env(os.environ)
    prefix = f"reins-bench-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(base.redis_url)
    count, events = (150, 60) if quick else (1800, 400)
    env = {
        "REINS_KEY_PREFIX": prefix,
        "REINS_REDIS_URL": base.redis_url,
        "REINS_BROKER_URL": base.broker_url,
    }
    with tempfile.TemporaryDirectory(prefix="reins-bench-api-") as tmp:
        fleet = LocalFleet(env, Path(tmp), client)
        try:
            fleet_config.apply(client, prefix, DOCUMENT)
            key = KeyRing(client, prefix).create("acme", "bench", {Scope.SUBMIT, Scope.READ})[0]
            port = _free_port()
            fleet.start("api", "api", "--port", str(port), "--log-level", "WARNING")
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: _ready(url), 60, "the API to be ready")
            _api_rate(port, key, THREADS * 4)  # warm: connections, imports
            rounds = [
                (
                    _api_rate(port, key, count // ROUNDS),
                    _direct_rate(client, prefix, count // ROUNDS),
                )
                for _ in range(ROUNDS)
            ]
            latencies = sorted(_event_latencies(url, key, client, prefix, events))
        finally:
            fleet.close()
            _delete(client, prefix)
            client.close()
    return {
        "peer": peer().as_json(),
        "threads": THREADS,
        "submissions": count,
        "api_submits_per_s": round(statistics.median(a for a, _ in rounds), 1),
        "direct_submits_per_s": round(statistics.median(d for _, d in rounds), 1),
        "ratio": round(statistics.median(a / d for a, d in rounds), 3),
        "events": len(latencies),
        "event_p50_ms": round(statistics.median(latencies), 2),
        "event_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
    }


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _delete(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    keys += list(client.scan_iter(match=f"{{{prefix}*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])
