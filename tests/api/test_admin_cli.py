"""``reins config apply|show`` and ``reins keys create|list|revoke`` on the fleet's Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from api.keys import KeyRing
from ops.local.fleet import ROOT
from tests.api.conftest import fleet_toml
from tests.conftest import REDIS_URL

pytestmark = pytest.mark.redis


def reins(prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINS_")}
    env.update({"REINS_KEY_PREFIX": prefix, "REINS_REDIS_URL": REDIS_URL, "COLUMNS": "200"})
    code = "from ops.cli.main import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_config_apply_versions_the_document_and_refuses_a_bad_one_changing_nothing(
    key_prefix: str, tmp_path: Path
) -> None:
    good, gates, bad = tmp_path / "fleet.toml", tmp_path / "gates.toml", tmp_path / "bad.toml"
    good.write_text(fleet_toml())
    gates.write_text('[routes."scripted/refund-policy"]\nconcurrency = 4\n')
    bad.write_text(fleet_toml().replace("weight = 3", "weight = -3"))
    first = reins(key_prefix, "config", "apply", str(good), "--gates", str(gates))
    assert first.returncode == 0 and "v1 applied" in first.stdout, first.stderr
    refused = reins(key_prefix, "config", "apply", str(bad))
    assert refused.returncode == 2 and "weight" in refused.stderr
    shown = json.loads(reins(key_prefix, "config", "show").stdout)
    assert shown["version"] == 1
    assert shown["gates"]["routes"]["scripted/refund-policy"]["concurrency"] == 4
    assert [t["agents"] for t in shown["tenants"]] == [["examples.support_store:agent"]] * 2


def test_keys_are_created_listed_without_their_secret_and_revoked(
    key_prefix: str, redis_client: redis.Redis
) -> None:
    made = reins(
        key_prefix, "keys", "create", "--tenant", "acme", "--principal", "ana", "--json",
        "--scope", "read,decide",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    assert created["scopes"] == ["decide", "read"]
    assert KeyRing(redis_client, key_prefix).verify(created["key"]) is not None
    listed = reins(key_prefix, "keys", "list", "--json").stdout
    assert created["key_id"] in listed and created["key"] not in listed
    unknown = reins(key_prefix, "keys", "create", "--principal", "x", "--scope", "root")
    assert unknown.returncode == 2 and "unknown scope" in unknown.stderr
    assert reins(key_prefix, "keys", "revoke", created["key_id"]).returncode == 0
    assert KeyRing(redis_client, key_prefix).verify(created["key"]) is None
    again = reins(key_prefix, "keys", "revoke", created["key_id"])
    assert again.returncode == 2 and "reins keys list" in again.stderr
