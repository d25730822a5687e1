"""Tenant configuration: loading from TOML and JSON, and every refusal naming what is wrong."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kernel.errors import ConfigError, InvalidInput
from router.admission.tenants import DEFAULT_CLASS, AdmissionConfig
from router.process.retention import DAY_S, retention_s

TOML = """
quantum_tokens = 8000
credit_cap_tokens = 64000

[[tenants]]
name = "acme"
weight = 3
max_ready = 500
largest_call_tokens = 42000
budget_max = { steps = 40, tokens = 1500000, dollars = 5.10 }
classes = [ { name = "interactive", weight = 3 }, { name = "maintenance", weight = 1 } ]

[[tenants]]
name = "globex"
weight = 1.5
max_ready = 20
largest_call_tokens = 2500
"""


def doc(**changes: Any) -> dict[str, Any]:
    """A valid two-tenant document; ``changes`` override top-level keys."""
    base: dict[str, Any] = {
        "quantum_tokens": 8000,
        "credit_cap_tokens": 64000,
        "tenants": [
            {"name": "acme", "weight": 3, "max_ready": 10, "largest_call_tokens": 42000},
            {"name": "globex", "weight": 1, "max_ready": 10, "largest_call_tokens": 2500},
        ],
    }
    base.update(changes)
    return base


def with_tenant(index: int, **changes: Any) -> dict[str, Any]:
    d = doc()
    d["tenants"][index] = {**d["tenants"][index], **changes}
    return d


def test_loads_toml_with_classes_and_exact_dollars(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(TOML)
    config = AdmissionConfig.from_file(path)
    acme = config.tenant("acme")
    assert acme is not None
    assert acme.class_names == ("interactive", "maintenance")
    assert acme.class_weights == (3.0, 1.0)
    # parsed as Decimal from the text, never through a binary float
    assert acme.budget_max.dollars == Decimal("5.10")
    assert acme.budget_max.tool_calls is None
    globex = config.tenant("globex")
    assert globex is not None and globex.weight == 1.5
    assert globex.class_names == (DEFAULT_CLASS,)
    assert config.tenant("nobody") is None


def test_loads_json(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps(doc()))
    config = AdmissionConfig.from_file(path)
    assert [t.name for t in config.tenants] == ["acme", "globex"]
    assert config.credit_cap_tokens == 64000


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("tenants.yaml", "x: 1", "expected a .toml or .json"),
        ("tenants.toml", "quantum_tokens = ", "not valid toml"),
        ("tenants.json", "{", "not valid json"),
        ("tenants.json", "[1, 2]", "must be a table/object"),
    ],
)
def test_unusable_files_are_refused(tmp_path: Path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        AdmissionConfig.from_file(path)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        AdmissionConfig.from_file(tmp_path / "absent.toml")


@pytest.mark.parametrize("weight", [0, -1, -0.5])
def test_non_positive_weight_names_the_tenant(weight: float) -> None:
    with pytest.raises(ConfigError, match=r"tenants\['globex'\]\.weight"):
        AdmissionConfig.from_mapping(with_tenant(1, weight=weight))


def test_non_positive_class_weight_names_tenant_and_class() -> None:
    bad = with_tenant(0, classes=[{"name": "interactive", "weight": 0}])
    with pytest.raises(ConfigError, match=r"tenants\['acme'\]\.classes\['interactive'\]\.weight"):
        AdmissionConfig.from_mapping(bad)


def test_credit_cap_below_a_largest_call_names_tenant_and_sizes() -> None:
    with pytest.raises(ConfigError) as info:
        AdmissionConfig.from_mapping(doc(credit_cap_tokens=40000))
    message = str(info.value)
    assert "'acme' (42,000)" in message
    assert "40,000" in message
    assert "globex" not in message  # its 2,500 fits


def test_cap_equal_to_largest_call_is_accepted() -> None:
    assert AdmissionConfig.from_mapping(doc(credit_cap_tokens=42000)).credit_cap_tokens == 42000


@pytest.mark.parametrize(
    ("document", "match"),
    [
        (doc(tenants=[]), "tenants"),
        (doc(quantum_tokens=0), "quantum_tokens"),
        (doc(surprise=1), "surprise"),
        (with_tenant(0, name="has space"), "name"),
        (with_tenant(0, max_ready=0), "max_ready"),
        (with_tenant(0, retention_days=-1), r"tenants\['acme'\]\.retention_days"),
        (with_tenant(0, retention_days=0), "retention_days: Input should be greater than 0"),
        (with_tenant(0, budget_max={"dollars": "0"}), "dollars"),
        (with_tenant(0, budget_max={"minutes": 3}), "minutes"),
        (with_tenant(1, name="acme"), "tenant names repeat"),
        (
            with_tenant(0, classes=[{"name": "a", "weight": 1}, {"name": "a", "weight": 2}]),
            "service class names repeat",
        ),
        (doc(wait_buckets_s=[1.0, 0.5]), "strictly increasing"),
        (doc(wait_buckets_s=[0.0, 1.0]), "positive"),
        (doc(quantum_tokens=1, tenants=[doc()["tenants"][1] | {"weight": 0.1}]), "rounds to zero"),
    ],
)
def test_bad_documents_are_refused_with_the_field_named(
    document: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        AdmissionConfig.from_mapping(document)
    assert isinstance(info.value, InvalidInput)


def test_retention_is_the_tenants_own_or_the_default() -> None:
    config = AdmissionConfig.from_mapping(with_tenant(1, retention_days=7))
    assert retention_s(config, "globex", 30.0) == 7 * DAY_S
    assert retention_s(config, "acme", 30.0) == 30 * DAY_S
    assert retention_s(config, "retired-tenant", 2.5) == 2.5 * DAY_S


def test_configuration_is_frozen() -> None:
    config = AdmissionConfig.from_mapping(doc())
    with pytest.raises(ValidationError):
        config.quantum_tokens = 1  # type: ignore[misc]
