"""The CLI's client commands against a real API process: JSON for scripts, and refusals that
say what to do next."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from ops.local.fleet import ROOT
from tests.api.conftest import AGENT, Keys
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def reins(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    env.update({"REINS_API_URL": url, "REINS_API_KEY": key, "COLUMNS": "200"})
    code = "from ops.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_submits_lists_shows_and_controls_through_the_api(api_url: str, keys: Keys) -> None:
    out = reins(api_url, keys.acme, "submit", "--agent", AGENT, "--goal", "refund ord_1", "--json")
    assert out.returncode == 0, out.stderr
    tid = json.loads(out.stdout)["trajectory_id"]

    listed = json.loads(reins(api_url, keys.acme, "ls", "--json").stdout)
    assert [t["trajectory_id"] for t in listed["items"]] == [tid]
    assert json.loads(reins(api_url, keys.globex, "ls", "--json").stdout)["items"] == []
    shown = json.loads(reins(api_url, keys.acme, "show", tid, "--json").stdout)
    assert shown["state"] == "READY" and shown["budget"]["steps"]["spent"] == "0"

    paused = reins(api_url, keys.acme, "pause", tid, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["state"] == "PAUSED"
    table = reins(api_url, keys.acme, "ls")
    assert tid in table.stdout and "PAUSED" in table.stdout


def test_a_refusal_says_what_is_wrong_and_what_to_do(api_url: str, keys: Keys) -> None:
    refused = reins(api_url, keys.acme, "submit", "--agent", "this:agent", "--goal", "g")
    assert refused.returncode == 2
    assert "(agent)" in refused.stderr and "ask the operator" in refused.stderr
    missing = reins(api_url, keys.acme, "show", "traj-nope")
    assert missing.returncode == 2 and "404" in missing.stderr
    held = reins(api_url, keys.acme, "approve", "traj-nope")
    assert held.returncode == 2
    bad_key = reins(api_url, "rk_00000000_nope", "ls")
    assert bad_key.returncode == 2 and "ask the operator for a key" in bad_key.stderr


def test_top_and_an_operators_direct_control_write_no_configuration(
    api_url: str, keys: Keys, redis_client: redis.Redis, key_prefix: str
) -> None:
    out = reins(api_url, keys.acme, "submit", "--agent", AGENT, "--goal", "refund ord_2", "--json")
    tid = json.loads(out.stdout)["trajectory_id"]
    top = reins(api_url, keys.operator, "top", "--json")
    assert top.returncode == 0, top.stderr
    assert [(u["tenant"], u["backlog"]) for u in json.loads(top.stdout)] == [
        ("acme", 1),
        ("globex", 0),
    ]
    config_before = redis_client.hgetall(f"{key_prefix}:fleet:config")

    env = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    env.update({"REINS_KEY_PREFIX": key_prefix, "REINS_REDIS_URL": REDIS_URL})
    code = "from ops.cli.main import main; main()"
    direct = subprocess.run(
        [sys.executable, "-c", code, "control", "acme", tid, "pause"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert direct.returncode == 0, direct.stderr
    assert json.loads(reins(api_url, keys.acme, "show", tid, "--json").stdout)["state"] == "PAUSED"
    assert redis_client.hgetall(f"{key_prefix}:fleet:config") == config_before
    assert list(redis_client.scan_iter(match=f"{{{key_prefix}:adm}}*")) == [], "gates written"


def test_an_api_that_does_not_answer_is_named_with_what_to_check() -> None:
    from tests.api.processes import free_port

    down = reins(f"http://127.0.0.1:{free_port()}", "rk_00000000_x", "ls")
    assert down.returncode == 2
    assert "cannot reach the API" in down.stderr and "reins up" in down.stderr
    assert "Traceback" not in down.stderr
