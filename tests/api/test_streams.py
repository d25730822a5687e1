"""Event streams hold no thread: many open followers leave the other endpoints answering."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import httpx
import pytest

from tests.api.conftest import AGENT, Keys

pytestmark = pytest.mark.redis
FOLLOWERS = 60  # above the threadpool's 40 threads that sync handlers share


def test_many_open_event_streams_leave_the_api_answering(api_url: str, keys: Keys) -> None:
    auth = {"Authorization": f"Bearer {keys.acme}"}
    job = {"agent": AGENT, "goal": "refund ord_1", "user": "cu_ana"}
    tid = httpx.post(f"{api_url}/v1/trajectories", json=job, headers=auth).json()["trajectory_id"]
    where = urlparse(api_url)
    request = (
        f"GET /v1/trajectories/{tid}/events HTTP/1.1\r\nHost: {where.netloc}\r\n"
        f"Authorization: Bearer {keys.acme}\r\n\r\n"
    ).encode()
    streams: list[socket.socket] = []
    try:
        for _ in range(FOLLOWERS):
            s = socket.create_connection((where.hostname, where.port), timeout=20)
            streams.append(s)
            s.sendall(request)
        for s in streams:  # each stream has begun: its headers came back
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(4096)
                assert chunk, "a stream was closed"
                head += chunk
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
        shown = httpx.get(f"{api_url}/v1/trajectories/{tid}", headers=auth, timeout=20)
        assert shown.status_code == 200 and shown.json()["state"] == "READY"
    finally:
        for s in streams:
            s.close()
