"""The two-admitter run of tests/integration/test_quota_two_admitters.py: its configuration, the
loopback provider, and the admitter process (``python -m tests.quota.fleet PREFIX MODE URL OUT``).

Four tenants of weights 1:2:3:4 with equal backlogs of 2,500 calls of the same size mix share one
route, whose gate (requests and tokens per 0.5 s window, 4 in flight) is much narrower than the
two admitters: most nominations are refused and wait READY. Each admitter process claims (``drr``:
the Redis admitter; ``fifo``: one shared list in submission order, the same gate debited by
``RedisGates.debit``), confirms, and hands the call to a sender thread that posts it to the
loopback provider and settles the gate with the usage the provider reports.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.request import Request, urlopen

import redis

from router.admission.gates import GateConfig, GateReading
from router.admission.redis.admitter import RedisAdmitter
from router.admission.redis.gates import RedisGates
from router.admission.tenants import AdmissionConfig

URL = os.environ.get("REINS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ROUTE = "loopback/model-1"
WINDOW_S = 0.5
RPM, TPM, CONCURRENCY = 400, 1_200_000, 4  # per 0.5 s window; in flight
SERVICE_S = 0.002  # the provider's simulated time per request (its work, not a wait)
SENDERS = 4  # sender threads per admitter process
WEIGHTS = {"w1": 1, "w2": 2, "w3": 3, "w4": 4}
PER_TENANT = 2_500
SIZES = ((1_000, 250), (3_000, 500), (6_000, 1_000))  # input tokens, output allowance
CONFIG = AdmissionConfig.from_mapping(
    {
        "quantum_tokens": 5_000,
        "credit_cap_tokens": 27_000,
        "tenants": [
            {"name": n, "weight": w, "max_ready": PER_TENANT, "largest_call_tokens": 7_000}
            for n, w in WEIGHTS.items()
        ],
    }
)
GATES = GateConfig.from_mapping(
    {
        "routes": {
            ROUTE: {
                "rpm": RPM,
                "tpm": TPM,
                "concurrency": CONCURRENCY,
                "window_s": WINDOW_S,
                "lease_ttl_s": 30,
            }
        }
    }
)


def backlog() -> list[tuple[str, str, int, int]]:
    """(tenant, trajectory id, input, output allowance), interleaved across tenants."""
    calls = []
    for k in range(PER_TENANT):
        for n, tenant in enumerate(WEIGHTS):
            i, o = SIZES[(k + n) % len(SIZES)]
            calls.append((tenant, f"{tenant}-{k}", i, o))
    return calls


# --- the loopback provider ------------------------------------------------------------------


@dataclass
class ProviderBook:
    """What the provider counts on its own side, by its own clock, over arrivals."""

    window_s: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    window: deque[tuple[float, str]] = field(default_factory=deque)
    amount: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    served: int = 0
    max_in_flight: int = 0
    max_requests: int = 0
    max_tokens: int = 0
    seen: set[str] = field(default_factory=set)
    repeats: int = 0

    def arrive(self, tid: str, declared: int) -> None:
        now = time.time()
        with self.lock:
            self.repeats += tid in self.seen
            self.seen.add(tid)
            self.in_flight += 1
            while self.window and self.window[0][0] <= now - self.window_s:
                _, old = self.window.popleft()
                self.tokens -= self.amount.pop(old)
            self.window.append((now, tid))
            self.amount[tid] = declared
            self.tokens += declared
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.max_requests = max(self.max_requests, len(self.window))
            self.max_tokens = max(self.max_tokens, self.tokens)

    def finish(self, tid: str, used: int) -> None:
        with self.lock:
            self.in_flight -= 1
            self.served += 1
            if tid in self.amount:  # still in the window: count what was really used
                self.tokens += used - self.amount[tid]
                self.amount[tid] = used


class LoopbackProvider:
    """A tiny HTTP provider on 127.0.0.1 that counts requests, tokens and in-flight calls."""

    def __init__(self, window_s: float) -> None:
        self.book = ProviderBook(window_s)
        book = self.book

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                tid, inp, max_out = body["trajectory_id"], body["input"], body["max_tokens"]
                book.arrive(tid, inp + max_out)
                time.sleep(SERVICE_S)  # the provider's simulated work
                used = inp + max_out * (1 + zlib.crc32(tid.encode()) % 4) // 4
                book.finish(tid, used)
                reply = json.dumps({"usage": used}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackProvider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the admitter process -------------------------------------------------------------------


class Sender:
    """Sends admitted calls from a few threads; settles the gate when the reply is back."""

    def __init__(self, gates: RedisGates, url: str) -> None:
        self.gates, self.url = gates, url
        self.pool = ThreadPoolExecutor(SENDERS)
        self.freed = threading.Event()

    def send(self, lease: str, tid: str, inp: int, out: int) -> None:
        self.pool.submit(self._post, lease, tid, inp, out)

    def _post(self, lease: str, tid: str, inp: int, out: int) -> None:
        body = json.dumps({"trajectory_id": tid, "input": inp, "max_tokens": out}).encode()
        request = Request(self.url, body, {"Content-Type": "application/json"})
        with urlopen(request, timeout=30) as reply:
            used = int(json.loads(reply.read())["usage"])
        self.gates.settle(ROUTE, lease, used)
        self.freed.set()

    def wait_for_room(self) -> None:
        """Backpressure: wait until a call settles or a window step passes."""
        self.freed.wait(0.005)
        self.freed.clear()


def run_drr(client: redis.Redis, prefix: str, sender: Sender) -> dict[str, Any]:
    admitter = RedisAdmitter(client, CONFIG, prefix=prefix, gates=sender.gates)
    records: list[list[Any]] = []
    refused = 0
    while True:
        attempt = admitter.claim(depths=True)
        refused += attempt.refused
        claim = attempt.claim
        if claim is None:
            if not attempt.refused:
                break  # nothing left to claim
            sender.wait_for_room()
            continue
        admitter.confirm(claim)
        call, gate = claim.call, claim.gate
        assert gate is not None
        records.append(
            [
                claim.seq,
                call.trajectory_id,
                call.tenant,
                call.charge,
                list(claim.depths),
                _counters(gate),
            ]
        )
        sender.send(claim.claim_id, call.trajectory_id, call.input_tokens, call.output_allowance)
    return {"records": records, "refused": refused}


def run_fifo(client: redis.Redis, prefix: str, sender: Sender) -> dict[str, Any]:
    tag = f"{{{prefix}:fifo}}"
    records: list[list[Any]] = []
    refused = 0
    while (raw := client.lpop(f"{tag}:queue")) is not None:
        tid = raw.decode()
        tenant, inp, out = client.hmget(f"{tag}:calls:{tid}", ["tenant", "input", "output"])
        charge = int(inp) + int(out)
        gate = sender.gates.debit(ROUTE, tid, charge)
        if not gate.ok:
            refused += 1
            client.lpush(f"{tag}:queue", tid)  # stays READY at the head
            sender.wait_for_room()
            continue
        pipe = client.pipeline(transaction=True)
        pipe.incr(f"{tag}:seq")
        pipe.hincrby(f"{tag}:depth", tenant.decode(), -1)
        pipe.hmget(f"{tag}:depth", list(WEIGHTS))
        seq, _, depths = pipe.execute()
        records.append(
            [seq, tid, tenant.decode(), charge, [int(d) for d in depths], _counters(gate)]
        )
        sender.send(tid, tid, int(inp), int(out))
    return {"records": records, "refused": refused}


def _counters(gate: GateReading) -> list[int]:
    return [gate.requests, gate.tokens, gate.leases, gate.rpm, gate.tpm, gate.concurrency]


def main() -> None:
    prefix, mode, url, out = sys.argv[1:5]
    client = redis.Redis.from_url(URL)
    sender = Sender(RedisGates(client, GATES, prefix=prefix), url)
    run = run_drr if mode == "drr" else run_fifo
    result = run(client, prefix, sender)
    sender.pool.shutdown(wait=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
