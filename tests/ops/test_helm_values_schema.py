"""The chart's values schema (helm/reins/values.schema.json): a values file with a wrong type,
an unknown key or a TLS section without a secret fails ``helm template`` before anything
renders, and the message names the value.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel.errors import InvalidInput
from kernel.settings import Settings
from router.wire.broker import broker_kind
from store.redis_client import CLUSTER_SCHEMES, SENTINEL_SCHEMES
from tests.ops.chart import CHART, helm, needs_helm

pytestmark = needs_helm

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
PRODUCTION = yaml.safe_load((CHART / "ci" / "production-values.yaml").read_text())
REFUSED = "values don't meet the specifications of the schema"


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """``node``, or the definition its ``$ref`` names."""
    ref = node.get("$ref")
    if ref is None:
        return node
    assert ref.startswith("#/definitions/"), ref
    return dict(SCHEMA["definitions"][ref.removeprefix("#/definitions/")])


def sections(values: dict[str, Any], node: dict[str, Any], path: str = "") -> Iterator[str]:
    """The dotted path of every mapping of ``values`` whose keys the schema lists ("" for the
    root); maps of free keys (labels, annotations, resources) are not sections."""
    node = resolve(node)
    if "properties" not in node:
        return
    yield path
    for key, value in values.items():
        if isinstance(value, dict) and key in node["properties"]:
            yield from sections(value, node["properties"][key], f"{path}.{key}".lstrip("."))


SECTIONS = sorted(sections(DEFAULTS, SCHEMA))


def open_objects(node: Any, where: str = "") -> Iterator[str]:
    """Every object of the schema that lists its properties and still takes others."""
    if isinstance(node, dict):
        if "properties" in node and node.get("additionalProperties") is not False:
            yield where or "(root)"
        for key, child in node.items():
            yield from open_objects(child, f"{where}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from open_objects(child, f"{where}/{i}")


def test_no_object_of_the_schema_takes_a_key_it_does_not_list() -> None:
    assert list(open_objects(SCHEMA)) == []
    assert {"", "settings", "router", "ingress", "metrics.serviceMonitor"} <= set(SECTIONS)


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s or "(root)")
def test_every_section_refuses_a_key_it_does_not_know(section: str) -> None:
    key = f"{section}.notAValue".lstrip(".")
    done = helm("template", "r", str(CHART), "--set", f"{key}=1")
    assert done.returncode != 0 and not done.stdout and REFUSED in done.stderr
    named = f"{section or '(root)'}: Additional property notAValue is not allowed"
    assert named in done.stderr, done.stderr


def with_mistake(path: str, value: Any) -> dict[str, Any]:
    """The production values with the value at dotted ``path`` replaced by ``value``."""
    values = copy.deepcopy(PRODUCTION)
    *parents, last = path.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return values


#: One mistake each in the production values, and what helm must say of it.
MISTAKES = {
    "wrong type": ("worker.replicas", "six", "worker.replicas: Invalid type. Expected: integer"),
    "wrong type of a setting": (
        "settings.max_turn_s",
        "2m",
        "settings.max_turn_s: Invalid type. Expected: [number,null], given: string",
    ),
    "unknown key": (
        "ingress.hosts",
        ["reins.example.com"],
        "ingress: Additional property hosts is not allowed",
    ),
    "unknown setting": (
        "settings.max_turn_sec",
        60,
        "settings: Additional property max_turn_sec is not allowed",
    ),
    "unknown top-level key": ("workers", {"replicas": 6}, "(root): Additional property workers"),
    "TLS without a secret": ("ingress.tls", {}, "ingress.tls: secretName is required"),
    "TLS with a misspelt secret": (
        "ingress.tls",
        {"secret": "reins-tls"},
        "ingress.tls: secretName is required",
    ),
    "TLS in the Ingress's own shape": (
        "ingress.tls",
        [{"hosts": ["reins.example.com"], "secretName": "reins-tls"}],
        "ingress.tls: Invalid type. Expected: [object,null], given: array",
    ),
    "a store URL of no scheme reins reads": (
        "store.redisUrl",
        "sentinel://reins-store-sentinel:26379/reins-store",
        "store.redisUrl: Does not match pattern",
    ),
    "a scrape interval that is no duration": (
        "metrics.serviceMonitor.interval",
        "30 seconds",
        "metrics.serviceMonitor.interval: Does not match pattern",
    ),
}


@pytest.mark.parametrize(("path", "value", "named"), MISTAKES.values(), ids=MISTAKES)
def test_a_values_file_with_a_mistake_fails_naming_the_value(
    tmp_path: Path, path: str, value: Any, named: str
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(with_mistake(path, value)))
    done = helm("template", "r", str(CHART), "-f", str(values))
    assert done.returncode != 0 and not done.stdout and REFUSED in done.stderr
    assert named in done.stderr, done.stderr


def own_values() -> set[str]:
    """The settings the chart sets from values of their own (the ``$own`` list of
    templates/_helpers.tpl, which refuses them under ``settings:``)."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    own = re.search(r"\$own := list ((?:\"[a-z_]+\" ?)+)", helpers)
    assert own, "templates/_helpers.tpl no longer lists $own"
    return set(re.findall(r'"([a-z_]+)"', own.group(1)))


def nullable(field: dict[str, Any]) -> dict[str, Any]:
    """A field of Settings' JSON schema as the values schema types it: null too (unset)."""
    out = {k: v for k, v in field.items() if k not in ("title", "default", "description")}
    for variant in out.pop("anyOf", []):
        if variant.get("type") != "null":
            out.update(variant)
    return out | {"type": [out["type"], "null"]}


def test_the_settings_section_types_every_setting_as_kernel_settings_does() -> None:
    """Every setting without a value of its own, no other, each with Settings' type and
    bounds: a new setting is a line in values.yaml and an entry in the schema."""
    expected = {
        name: nullable(field)
        for name, field in Settings.model_json_schema()["properties"].items()
        if name not in own_values() and name != "sqlite_path"  # the embedded store only
    }
    assert own_values() <= set(Settings.model_fields)
    assert SCHEMA["properties"]["settings"]["properties"] == expected


def pattern(*path: str) -> str:
    node = SCHEMA
    for key in path:
        node = node["properties"][key]
    return str(node["pattern"])


SCHEMES = ["redis", "rediss", "amqp", "amqps", "http", "unix", "sentinel", "redis+socket"]


@pytest.mark.parametrize("scheme", sorted({*SCHEMES, *CLUSTER_SCHEMES, *SENTINEL_SCHEMES}))
def test_the_url_patterns_take_the_schemes_reins_reads(scheme: str) -> None:
    """The store: one Redis, a Redis Cluster or the master Sentinels name (store/redis_client.py;
    a Unix socket is never in a pod); the broker: Redis or RabbitMQ (router/wire/broker.py)."""
    url = f"{scheme}://reins-redis:6379/0"
    store = scheme in {"redis", "rediss", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES}
    assert bool(re.match(pattern("store", "redisUrl"), url)) is store
    try:
        broker_kind(url)
        broker = True
    except InvalidInput:
        broker = False
    assert bool(re.match(pattern("broker", "url"), url)) is broker
