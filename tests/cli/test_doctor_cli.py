"""`reins doctor`: the feed's streams, each router's pending entries and the dead letters, as a
table and as JSON; no Redis is one error line saying what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis
import typer
from typer.testing import CliRunner

from kernel.events import CallModel
from ops.cli import doctor as cli_doctor
from router.wire.feed import Feed
from router.wire.notices import Notice, NoticeKind
from router.wire.streams import FIELD
from router.wire.turns import HandBack, HandBackWhy, TurnMessage
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis
POISON = b'["ready", "acme", "t-9", 4, "", 1, 1, 0.0, "", "", "", -1, "", -1.0, {}, "newer"]'


@pytest.fixture
def doctor(key_prefix: str, monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("REINS_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("REINS_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line, whatever the terminal
    app = typer.Typer()
    app.callback()(lambda: None)  # a group, so the command is called by its name
    cli_doctor.register(app)
    return app


def troubled_feed(client: redis.Redis, prefix: str) -> Feed:
    """Router r1 took three notices and died; a poison notice and a poison hand-back are dead;
    one notice and one hand-back wait."""
    r1 = Feed(client, prefix, router="r1")
    r1.create_groups()
    r1.push(*(Notice(NoticeKind.READY, "acme", f"t-{n}", 1) for n in range(3)))
    client.xadd(r1.notices_key, {FIELD: POISON})
    assert len(r1.take()) == 3  # ... and r1 dies: never done
    client.xadd(r1.handbacks_key, {FIELD: b"{}"})
    assert len(r1.take_handbacks()) == 0
    r1.push(Notice(NoticeKind.IDLE, "acme", "t-7", 2))
    call = CallModel(
        call_id="t/m1", attempt_id="t/m1/a1", view="{}", max_output_tokens=9, timeout_s=3
    )
    msg = TurnMessage("acme", "t-8", 3, 0, (call,), 1.0)
    r1.hand_back(HandBack("w1", HandBackWhy.DRAINING, msg))
    return r1


@pytest.mark.usefixtures("doctor")
def test_json_lists_lengths_pending_entries_per_router_and_dead_letters(
    doctor: typer.Typer, redis_client: redis.Redis, key_prefix: str
) -> None:
    feed = troubled_feed(redis_client, key_prefix)
    result = CliRunner().invoke(doctor, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    assert view["prefix"] == key_prefix
    assert view["streams"] == {
        "notices": {"length": 4, "pending": 3},
        "handbacks": {"length": 1, "pending": 0},
        "dead": {"length": 2, "pending": 0},
    }
    (pending,) = view["pending"]
    assert (pending["stream"], pending["router"], pending["entries"]) == ("notices", "r1", 3)
    assert len(pending["pending"]) == 3 and pending["oldest_idle_s"] >= 0
    assert all(e["deliveries"] == 1 for e in pending["pending"])
    newest, oldest = view["dead_letters"]
    assert (newest["source"], newest["raw"]) == ("handbacks", "{}")
    assert (oldest["source"], oldest["stream"]) == ("notices", feed.notices_key)
    assert oldest["raw"] == POISON.decode() and "malformed notice" in oldest["error"]
    assert newest["at"] >= oldest["at"] > 0


@pytest.mark.usefixtures("doctor")
def test_the_table_shows_the_same_with_raw_bytes_shortened(
    doctor: typer.Typer, redis_client: redis.Redis, key_prefix: str
) -> None:
    troubled_feed(redis_client, key_prefix)
    result = CliRunner().invoke(doctor, ["doctor"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    rows = [[cell.strip() for cell in ln.split("│")] for ln in lines]
    assert ["notices", "4", "3"] in rows, result.output
    assert any(row[:3] == ["notices", "r1", "3"] for row in rows), result.output
    dead = [ln for ln in lines if "malformed notice" in ln]
    assert len(dead) == 1 and "handbacks" in result.output
    assert cli_doctor.shorten(POISON) in dead[0] and POISON.decode() not in result.output
    assert cli_doctor.shorten(POISON).endswith("…")


@pytest.mark.usefixtures("doctor")
def test_an_untouched_feed_has_nothing_to_show(doctor: typer.Typer) -> None:
    result = CliRunner().invoke(doctor, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    assert view["pending"] == [] and view["dead_letters"] == []
    assert {s["length"] for s in view["streams"].values()} == {0}
    table = CliRunner().invoke(doctor, ["doctor"]).output
    assert "no dead letters" in table and "nothing taken and not acknowledged" in table


def test_no_redis_is_one_error_line_saying_what_to_do() -> None:
    env = {**os.environ, "REINS_REDIS_URL": "redis://127.0.0.1:1/0", "COLUMNS": "400"}
    p = subprocess.run(
        [sys.executable, "-c", "from ops.cli.main import main; main()", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert line.startswith("error: Redis at redis://127.0.0.1:1/0 (REINS_REDIS_URL)")
    assert "make redis" in line and "REINS_REDIS_URL" in line
