"""``reins config apply`` with routed models, as an operator runs it: a route with an unknown
protocol, a malformed base URL or no price is refused naming the field and changes nothing; a
key reference that does not resolve on this machine is applied with a warning; the document
and ``reins config show`` hold the references, never a key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from ops.local.fleet import ROOT
from router.fleet.config import config_key
from tests.api.conftest import fleet_toml
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis
AGENT = "examples.support_store:agent_routed"
SECRET = "sk-live-0123456789abcdef"
MODELS = """
[models."refund-policy"]
price = { input_per_m = "3", cached_input_per_m = "0.30", output_per_m = "15" }
[[models."refund-policy".routes]]
name = "primary"
protocol = "openai-compatible"
base_url = "https://api.openai.com/v1"
api_key_env = "REFUND_OPENAI_KEY"
gates = { concurrency = 4 }
[[models."refund-policy".routes]]
name = "backup"
protocol = "anthropic"
base_url = "https://api.anthropic.com"
api_key_file = "KEY_FILE"
"""


def reins(prefix: str, *args: str, env: dict[str, str] | None = None) -> Any:
    full = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    full.update({"REINS_KEY_PREFIX": prefix, "REINS_REDIS_URL": REDIS_URL, "COLUMNS": "200"})
    full.update(env or {})
    code = "from ops.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


def document(tmp_path: Path, models: str, name: str = "fleet.toml") -> Path:
    key_file = tmp_path / "backup.key"
    key_file.write_text(SECRET + "\n")
    path = tmp_path / name
    path.write_text(fleet_toml((AGENT,)) + models.replace("KEY_FILE", str(key_file)))
    return path


def test_a_route_whose_key_is_not_here_is_applied_with_a_warning(
    key_prefix: str, tmp_path: Path, redis_client: redis.Redis
) -> None:
    done = reins(key_prefix, "config", "apply", str(document(tmp_path, MODELS)))
    assert done.returncode == 0, done.stderr
    assert "v1 applied" in done.stdout
    assert "warning" in done.stderr and "REFUND_OPENAI_KEY is not set" in done.stderr
    assert "primary" in done.stderr and "backup" not in done.stderr  # its file resolves
    stored = redis_client.hget(config_key(key_prefix), "document")
    assert stored is not None and b"REFUND_OPENAI_KEY" in stored and SECRET.encode() not in stored
    shown = reins(key_prefix, "config", "show", env={"REFUND_OPENAI_KEY": SECRET})
    out = json.loads(shown.stdout)
    routes = out["models"]["refund-policy"]["routes"]
    assert [r["name"] for r in routes] == ["primary", "backup"]
    assert routes[0]["api_key_env"] == "REFUND_OPENAI_KEY"
    assert "routes/refund-policy/primary" in out["gates"]["routes"]
    assert SECRET not in shown.stdout + shown.stderr


def test_with_its_key_set_there_is_no_warning_and_the_key_is_not_shown(
    key_prefix: str, tmp_path: Path
) -> None:
    done = reins(
        key_prefix,
        "config",
        "apply",
        str(document(tmp_path, MODELS)),
        env={"REFUND_OPENAI_KEY": SECRET},
    )
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            ('protocol = "anthropic"', 'protocol = "grpc"'),
            "models.refund-policy.routes['backup'].protocol",
        ),
        (
            ('"https://api.openai.com/v1"', '"api.openai.com/v1"'),
            "models.refund-policy.routes['primary'].base_url",
        ),
        (
            ('price = { input_per_m = "3", cached_input_per_m = "0.30", output_per_m = "15" }', ""),
            "models.refund-policy.routes['primary'].price",
        ),
    ],
)
def test_a_bad_route_is_refused_naming_the_field_and_changes_nothing(
    key_prefix: str, tmp_path: Path, change: tuple[str, str], field: str
) -> None:
    good = reins(key_prefix, "config", "apply", str(document(tmp_path, MODELS)))
    assert good.returncode == 0, good.stderr
    bad = document(tmp_path, MODELS.replace(*change), name="bad.toml")
    refused = reins(key_prefix, "config", "apply", str(bad))
    assert refused.returncode == 2 and field in refused.stderr, refused.stderr
    assert "warning" not in refused.stderr  # refused before any key is looked for
    assert json.loads(reins(key_prefix, "config", "show").stdout)["version"] == 1
