"""The probes answer from their checks on a thread of their own, on loopback."""

from __future__ import annotations

import urllib.error
import urllib.request

from router.fleet.health import Beat, HealthServer


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode().strip()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode().strip()


def test_each_probe_answers_its_check_and_nothing_else_is_served() -> None:
    why: dict[str, str | None] = {"live": None, "ready": "not registered yet"}
    server = HealthServer(
        "127.0.0.1", 0, live=lambda: why["live"], ready=lambda: why["ready"]
    ).start()
    try:
        assert get(server.port, "/livez") == (200, "ok")
        assert get(server.port, "/readyz") == (503, "not registered yet")
        why["ready"] = None
        why["live"] = "the router loop made no progress for 31.0s"
        assert get(server.port, "/readyz") == (200, "ok")
        assert get(server.port, "/livez") == (503, "the router loop made no progress for 31.0s")
        assert get(server.port, "/metrics")[0] == 404
    finally:
        server.stop()


def test_a_check_that_raises_fails_its_probe() -> None:
    def broken() -> str | None:
        raise RuntimeError("redis down")

    server = HealthServer("127.0.0.1", 0, live=broken, ready=lambda: None).start()
    try:
        code, body = get(server.port, "/livez")
        assert code == 503 and "redis down" in body
    finally:
        server.stop()


def test_a_beat_goes_stale_when_its_loop_stops_going_round() -> None:
    beat = Beat("the loop")
    assert beat.stale(60.0) is None
    beat.at -= 120.0  # as if the loop last went round two minutes ago
    assert beat.stale(60.0) == "the loop made no progress for 120.0s"
