"""``reins config apply``, ``reins freeze`` and ``reins grants`` on the document's authority
section: a setting naming an unknown tenant, tool or stage is refused naming the field, and the
document's version does not move."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from kernel.agent import Escalation
from router.fleet import config as fleet_config
from tests.api.conftest import fleet_toml
from tests.api.test_admin_cli import reins

pytestmark = pytest.mark.redis
ESCALATION = "authority.tenants.acme.escalation"


@pytest.fixture
def version(key_prefix: str, tmp_path: Path) -> int:
    good = tmp_path / "fleet.toml"
    good.write_text(fleet_toml() + "\n[authority.tenants.acme.escalation]\nsteer = 2\n")
    done = reins(key_prefix, "config", "apply", str(good))
    assert done.returncode == 0, done.stderr
    return 1


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("[authority.tenants.initech]\nfrozen = true\n", "authority.tenants.initech"),
        (
            '[authority.tenants.acme.grants]\ntools = ["get_order", "drop_database"]\n',
            "authority.tenants.acme.grants.tools",
        ),
        ("[authority.tenants.acme.escalation]\npanic = 1\n", f"{ESCALATION}.panic"),
        ("[authority.tenants.acme.escalation]\nfinalize = 0\n", f"{ESCALATION}.finalize"),
        ("[authority.tenants.acme]\nfrozen = 3\n", "authority.tenants.acme.frozen"),
        ("[authority.tenants.acme]\nthawed = true\n", "authority.tenants.acme.thawed"),
    ],
)  # fmt: skip
def test_config_apply_refuses_an_unknown_tenant_tool_or_stage_naming_the_field(
    key_prefix: str, tmp_path: Path, redis_client: redis.Redis, version: int, section: str,
    field: str,
) -> None:  # fmt: skip
    bad = tmp_path / "bad.toml"
    bad.write_text(fleet_toml() + "\n" + section)
    refused = reins(key_prefix, "config", "apply", str(bad))
    assert refused.returncode == 2 and field in refused.stderr, refused.stderr
    assert fleet_config.stored_version(redis_client, key_prefix) == version, "nothing changed"


def test_the_document_turns_on_staged_escalation_for_a_tenant(
    key_prefix: str, redis_client: redis.Redis, version: int
) -> None:
    fleet = fleet_config.require(redis_client, key_prefix)
    acme = fleet.authority.of("acme")
    assert acme is not None
    assert acme.escalation == Escalation(steer_at_calls=2, restrict_at_calls=-1)
    assert fleet.authority.of("globex") is None


def test_reins_freeze_and_grants_edit_the_document_and_refuse_an_unknown_name(
    key_prefix: str, redis_client: redis.Redis, version: int
) -> None:
    frozen = reins(key_prefix, "freeze", "globex", "--json")
    assert frozen.returncode == 0, frozen.stderr
    assert json.loads(frozen.stdout) == {"tenant": "globex", "frozen": True, "version": 2}
    granted = reins(key_prefix, "grants", "acme", "--tools", "get_order", "--deny-target", "ord_1")
    assert granted.returncode == 0, granted.stderr
    shown = json.loads(reins(key_prefix, "config", "show").stdout)
    assert shown["version"] == 3
    assert shown["authority"]["globex"]["frozen"] is True
    assert shown["authority"]["acme"]["grants"]["tools"] == ["get_order"]
    assert shown["authority"]["acme"]["escalation"] == {"steer": 2}, "the rest is kept"

    for args, field in [
        (("freeze", "initech"), "authority.tenants.initech"),
        (("grants", "acme", "--tools", "rm_rf"), "authority.tenants.acme.grants.tools"),
    ]:
        refused = reins(key_prefix, *args)
        assert refused.returncode == 2 and field in refused.stderr, refused.stderr
    assert fleet_config.stored_version(redis_client, key_prefix) == 3, "nothing changed"
    both = reins(key_prefix, "freeze", "acme", "--trajectory", "t1")
    assert both.returncode == 2 and "one of them" in both.stderr
