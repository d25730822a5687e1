"""Every manifest the chart renders, validated against the Kubernetes API's own schemas.

The schemas are the ones kubernetes-validate (PyPI) packages: the OpenAPI documents of each
Kubernetes release in their strict form, where an object refuses a field its type does not have,
as the API server's strict field validation does. The chart is rendered for the oldest release
it supports (Chart.yaml's kubeVersion) and for the newest the package holds, with the default
values and with helm/reins/ci/production-values.yaml (an Ingress with TLS, a ServiceMonitor, the
store behind Sentinels), which renders every template.

No Kubernetes release has the schema of a custom resource: a ServiceMonitor
(monitoring.coreos.com/v1) is validated against schemas/servicemonitor-monitoring-v1.json,
stated beside this file; a kind with no schema either way fails the test.
"""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from kernel.settings import Settings
from router.admission.gates import GateConfig
from router.fleet import config as fleet_config
from store.redis_client import client_from_url
from tests.ops.chart import CHART, RepeatedKey, helm, manifests, needs_helm

pytestmark = needs_helm

PRODUCTION = CHART / "ci" / "production-values.yaml"
SCHEMAS = Path(__file__).parent / "schemas"
#: Custom resources the chart renders, by apiVersion and kind: the schema stated for each.
STATED = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-monitoring-v1.json",
}


def oldest_supported() -> str:
    """The floor of Chart.yaml's kubeVersion (``>=1.25.0-0`` gives ``1.25.0``)."""
    constraint = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    floor = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", constraint)
    assert floor, f"Chart.yaml kubeVersion {constraint!r}: this test reads >=X.Y.Z"
    return floor.group(1)


KUBERNETES = (oldest_supported(), kubernetes_validate.latest_version())
VALUES = {"default": None, "production": PRODUCTION}


@cache
def rendered(values: Path | None, kubernetes: str, chart: Path = CHART) -> str:
    """``helm template`` of ``chart`` with ``values`` (None: its own) for a cluster of that
    Kubernetes version."""
    args = ["-f", str(values)] if values else []
    done = helm(
        "template", "r", str(chart), "--namespace", "fleet", "--kube-version", kubernetes, *args
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@cache
def stated_validator(schema: Path, kubernetes: str) -> jsonschema.Draft202012Validator:
    """A validator of ``schema``, whose references to Kubernetes types resolve to the packaged
    definitions of that release."""
    release = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    definitions = json.loads(
        (release / f"v{kubernetes}-local-strict" / "_definitions.json").read_text()
    )
    registry: Registry[Any] = Resource.from_contents(definitions) @ Registry()
    return jsonschema.Draft202012Validator(json.loads(schema.read_text()), registry=registry)


def refusal(doc: dict[str, Any], kubernetes: str) -> str | None:
    """Why the API server of that Kubernetes version would refuse ``doc``, naming the field at
    fault; None if it would take it."""
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    stated = STATED.get((doc["apiVersion"], doc["kind"]))
    try:
        if stated is None:
            kubernetes_validate.validate(doc, kubernetes, strict=True)
        else:
            stated_validator(stated, kubernetes).validate(doc)
    except jsonschema.ValidationError as error:
        field = ".".join(str(p) for p in error.absolute_path) or "(root)"
        return f"{where}: {field}: {error.message}"
    except kubernetes_validate.SchemaNotFoundError as error:
        return f"{where}: {error.message}; state its schema in STATED"
    return None


def refusals(text: str, kubernetes: str) -> list[str]:
    return [r for d in manifests(text) if (r := refusal(d, kubernetes)) is not None]


@pytest.mark.parametrize("kubernetes", KUBERNETES)
@pytest.mark.parametrize("values", VALUES.values(), ids=VALUES.keys())
def test_every_manifest_validates_against_the_kubernetes_schemas(
    values: Path | None, kubernetes: str
) -> None:
    text = rendered(values, kubernetes)
    kinds = {d["kind"] for d in manifests(text)}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds  # not empty
    assert refusals(text, kubernetes) == []


def test_the_production_values_render_every_template() -> None:
    """So the schema test above sees every template, Ingress and ServiceMonitor included."""
    text = rendered(PRODUCTION, KUBERNETES[-1])
    sources = set(re.findall(r"^# Source: reins/(templates/\S+)$", text, re.MULTILINE))
    templates = {f"templates/{t.name}" for t in (CHART / "templates").glob("*.yaml")}
    assert templates <= sources, f"not rendered by {PRODUCTION.name}: {templates - sources}"
    ingress = next(d for d in manifests(text) if d["kind"] == "Ingress")
    assert ingress["spec"]["tls"][0]["secretName"] == "reins-tls"


def test_the_production_values_are_a_deployment_reins_accepts() -> None:
    """Its settings pass kernel/settings.py, its store URL names Sentinels and a master, its
    fleet document and gates parse."""
    docs = manifests(rendered(PRODUCTION, KUBERNETES[-1]))
    stores = set()
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("REINS_")})
        assert settings.key_prefix == "reins-prod"
        assert "REINS_BROKER_URL" not in env, "the broker's URL comes from its Secret"
        stores.add(settings.redis_url)
    (url,) = stores
    store = client_from_url(url)
    try:
        pool = store.connection_pool
        assert pool.service_name == "reins-store"  # type: ignore[attr-defined]
        assert len(pool.sentinel_manager.sentinels) == 3  # type: ignore[attr-defined]
    finally:
        store.close()
    (config,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "r-reins-config"
    ]
    admission, _ = fleet_config.parse_document(tomllib.loads(config["data"]["fleet.toml"]))
    assert {t.name for t in admission.tenants} == {"support", "research"}
    GateConfig.from_mapping(tomllib.loads(config["data"]["gates.toml"]))


#: Mistakes in a template, each with what the validator must say of it: a field of no such
#: name (at the top of a spec, deep in a pod, in the ServiceMonitor) and a port as a string.
MUTATIONS = {
    "unknown field": (
        "router-deployment.yaml",
        "  replicas: {{ .Values.router.replicas }}",
        "  replicaz: {{ .Values.router.replicas }}",
        "Deployment/r-reins-router: spec: Additional properties are not allowed "
        "('replicaz' was unexpected)",
    ),
    "unknown field in every pod": (
        "_helpers.tpl",
        "topologySpreadConstraints:",
        "topologySpreadConstraint:",
        "Deployment/r-reins-api: spec.template.spec: Additional properties are not allowed "
        "('topologySpreadConstraint' was unexpected)",
    ),
    "wrong type": (
        "worker-metrics-service.yaml",
        "port: {{ .Values.metrics.port }}",
        "port: {{ .Values.metrics.port | quote }}",
        "Service/r-reins-worker-metrics: spec.ports.0.port: '9100' is not of type 'integer'",
    ),
    "unknown field of a custom resource": (
        "servicemonitor.yaml",
        "scrapeTimeout: {{",
        "scrapeTimout: {{",
        "ServiceMonitor/r-reins: spec.endpoints.0: Additional properties are not allowed "
        "('scrapeTimout' was unexpected)",
    ),
}


def mutated_chart(tmp_path: Path, template: str, old: str, new: str) -> Path:
    chart = tmp_path / "reins"
    shutil.copytree(CHART, chart)
    path = chart / "templates" / template
    text = path.read_text()
    assert text.count(old) == 1, f"{template} no longer has {old!r}: update the mutation"
    path.write_text(text.replace(old, new))
    return chart


@pytest.mark.parametrize(("template", "old", "new", "named"), MUTATIONS.values(), ids=MUTATIONS)
def test_a_broken_template_is_refused_naming_the_field(
    tmp_path: Path, template: str, old: str, new: str, named: str
) -> None:
    chart = mutated_chart(tmp_path, template, old, new)
    kubernetes = KUBERNETES[-1]
    found = refusals(rendered(PRODUCTION, kubernetes, chart), kubernetes)
    assert named in found, found


def test_a_key_given_twice_in_a_manifest_is_refused(tmp_path: Path) -> None:
    """As the router's pod annotations once gave ``checksum/config`` twice."""
    line = "  replicas: {{ .Values.router.replicas }}"
    chart = mutated_chart(tmp_path, "router-deployment.yaml", line, f"{line}\n{line}")
    with pytest.raises(RepeatedKey, match="found the key 'replicas' again"):
        manifests(rendered(None, KUBERNETES[-1], chart))
