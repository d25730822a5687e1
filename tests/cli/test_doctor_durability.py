"""`reins doctor` on Redis's durability: each parameter that contradicts what reins assumes
earns one warning naming it and what to set; the running server's own values are reported."""

from __future__ import annotations

import json

import pytest
import redis
import typer
from typer.testing import CliRunner

from ops.cli.durability import durability_warnings, read_durability
from store.redis_client import text
from tests.cli.test_doctor_cli import doctor  # noqa: F401 - the fixture

SOUND = {
    "appendonly": "yes",
    "appendfsync": "everysec",
    "maxmemory-policy": "noeviction",
    "maxmemory": "4294967296",
}


def test_a_sound_server_earns_no_warning() -> None:
    assert durability_warnings(SOUND) == []
    assert durability_warnings({**SOUND, "appendfsync": "always"}) == []


@pytest.mark.parametrize(
    ("change", "names"),
    [
        ({"appendonly": "no"}, "appendonly is not yes"),
        ({"appendfsync": "no"}, "appendfsync is 'no'"),
        ({"maxmemory-policy": "allkeys-lru"}, "maxmemory-policy is 'allkeys-lru'"),
        ({"maxmemory-policy": "volatile-ttl"}, "maxmemory-policy is 'volatile-ttl'"),
        ({"maxmemory": "0"}, "maxmemory is 0"),
    ],
)
def test_each_contradiction_is_one_warning_naming_it(change: dict[str, str], names: str) -> None:
    (warning,) = durability_warnings({**SOUND, **change})
    assert warning.startswith(f"Redis {names}") and "set " in warning


def test_a_server_without_aof_is_not_also_told_about_fsync() -> None:
    (warning,) = durability_warnings({**SOUND, "appendonly": "no", "appendfsync": "no"})
    assert "appendonly" in warning


@pytest.mark.redis
def test_doctor_reports_the_running_servers_values(
    doctor: typer.Typer,  # noqa: F811
    redis_client: redis.Redis,
) -> None:
    result = CliRunner().invoke(doctor, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    reported = json.loads(result.output)["durability"]
    actual = {text(k): text(v) for k, v in redis_client.config_get("append*").items()}
    actual |= {text(k): text(v) for k, v in redis_client.config_get("maxmemory*").items()}
    for name in ("appendonly", "appendfsync", "maxmemory-policy", "maxmemory"):
        assert reported["config"][name] == actual[name]
    assert reported["warnings"] == durability_warnings(reported["config"])
    assert read_durability(redis_client).warnings == reported["warnings"]
    table = CliRunner().invoke(doctor, ["doctor"]).output
    assert all(w.split(":")[0] in table for w in reported["warnings"])
