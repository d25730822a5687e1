"""The Helm chart, checked with a real helm (``make tools`` puts it at .tools/helm).

``helm lint`` and ``helm template`` run offline; the rendered manifests are parsed and checked
against the code they deploy: the env names are the fields of kernel/settings.py, the values
pass ``Settings.from_env``, the tenants file passes ``AdmissionConfig``, and the dashboard
ConfigMap holds the committed dashboard JSON.
"""

from __future__ import annotations

import json
import tomllib
from functools import cache
from typing import Any

import pytest
import yaml

from kernel.settings import PREFIX, Settings
from ops.observability.dashboard import DASHBOARD_PATH
from router.admission.gates import GateConfig
from router.fleet import config as fleet_config
from tests.ops.chart import CHART, helm, manifests, needs_helm

#: Settings the fleet does not set, and why; every other field must be in the chart's env.
NOT_FROM_THE_CHART = {
    "sqlite_path": "the embedded store only",
    "tenants_file": "the fleet's document in Redis (reins config apply at router boot)",
    "scripted_latency_s": "scripted models only (settings.scripted_latency_s: null)",
}

pytestmark = needs_helm


@cache
def render(*sets: str) -> tuple[dict[str, Any], ...]:
    """``helm template`` with ``--set`` overrides, as parsed manifests."""
    args = [a for s in sets for a in ("--set", s)]
    done = helm("template", "r", str(CHART), "--namespace", "fleet", *args)
    assert done.returncode == 0, done.stderr
    return manifests(done.stdout)


def one(docs: tuple[dict[str, Any], ...], kind: str, suffix: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def container(docs: tuple[dict[str, Any], ...], component: str) -> dict[str, Any]:
    pod = one(docs, "Deployment", f"-{component}")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    return dict(c)


def reins_env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c["env"] if e["name"].startswith(PREFIX)}


def values() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_helm_lint_passes_strict() -> None:
    done = helm("lint", "--strict", str(CHART))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_default_render_has_the_fleet_and_no_service_monitor() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in render())
    assert kinds == [
        ("ConfigMap", "r-reins-config"),
        ("ConfigMap", "r-reins-dashboard"),
        ("Deployment", "r-reins-api"),
        ("Deployment", "r-reins-router"),
        ("Deployment", "r-reins-worker"),
        ("PodDisruptionBudget", "r-reins-api"),
        ("PodDisruptionBudget", "r-reins-router"),
        ("PodDisruptionBudget", "r-reins-worker"),
        ("Service", "r-reins-api"),
        ("Service", "r-reins-router"),
        ("Service", "r-reins-worker-metrics"),
        ("ServiceAccount", "r-reins"),
    ]


def test_worker_replicas_follow_values() -> None:
    assert (
        one(render(), "Deployment", "-worker")["spec"]["replicas"] == values()["worker"]["replicas"]
    )
    three = render("worker.replicas=3")
    assert one(three, "Deployment", "-worker")["spec"]["replicas"] == 3
    assert one(three, "Deployment", "-router")["spec"]["replicas"] == values()["router"]["replicas"]


@pytest.mark.parametrize("sets", [(), ("worker.drainGraceSeconds=300",)])
def test_worker_grace_period_covers_the_drain(sets: tuple[str, ...]) -> None:
    docs = render(*sets)
    pod = one(docs, "Deployment", "-worker")["spec"]["template"]["spec"]
    drain = float(reins_env(container(docs, "worker"))["REINS_DRAIN_GRACE_S"]["value"])
    extra = values()["worker"]["terminationExtraSeconds"]
    assert pod["terminationGracePeriodSeconds"] == drain + extra > drain
    # SIGTERM drains: no preStop hook, and the worker is PID 1 (exec form, no shell)
    c = container(docs, "worker")
    assert "lifecycle" not in c
    assert c["command"][0] not in ("sh", "bash", "/bin/sh")


@pytest.mark.parametrize("component", ["router", "worker", "api"])
def test_env_names_are_the_settings_fields(component: str) -> None:
    env = reins_env(container(render(), component))
    fields = {PREFIX + name.upper() for name in Settings.model_fields}
    unknown = set(env) - fields
    assert not unknown, f"not reins settings (the pod would refuse to start): {unknown}"
    expected = {PREFIX + n.upper() for n in Settings.model_fields if n not in NOT_FROM_THE_CHART}
    missing = expected - set(env)
    assert not missing, (
        f"settings the chart does not set: {missing}; add them under `settings:` in "
        "helm/reins/values.yaml (or to NOT_FROM_THE_CHART with the reason)"
    )
    # every value the chart renders is one Settings accepts
    settings = Settings.from_env({k: e["value"] for k, e in env.items()})
    assert settings.redis_url != settings.broker_url


def test_store_and_broker_urls_stay_separate() -> None:
    env = reins_env(container(render(), "worker"))
    assert env["REINS_REDIS_URL"]["value"] == values()["store"]["redisUrl"]
    assert env["REINS_BROKER_URL"]["value"] == values()["broker"]["url"]
    secret = render("store.existingSecret=store-creds", "broker.existingSecret=broker-creds")
    env = reins_env(container(secret, "worker"))
    store = env["REINS_REDIS_URL"]["valueFrom"]["secretKeyRef"]
    broker = env["REINS_BROKER_URL"]["valueFrom"]["secretKeyRef"]
    assert (store["name"], broker["name"]) == ("store-creds", "broker-creds")
    assert store["key"] != broker["key"]


def test_a_setting_with_its_own_value_cannot_repeat_under_settings() -> None:
    repeated = ("--set", "settings.redis_url=redis://x:6379/0")
    done = helm("template", "r", str(CHART), *repeated)
    assert done.returncode != 0
    assert "settings: Additional property redis_url is not allowed" in done.stderr
    # the template says where it belongs when the values schema is skipped
    done = helm("template", "r", str(CHART), *repeated, "--skip-schema-validation")
    assert done.returncode != 0
    assert "settings.redis_url has its own value" in done.stderr


def test_the_configmap_is_a_fleet_document_the_routers_init_container_applies() -> None:
    docs = render()
    data = one(docs, "ConfigMap", "-config")["data"]
    (name,) = data  # no gates by default
    admission, gates = fleet_config.parse_document(tomllib.loads(data[name]))
    assert gates is None and all(t.agents for t in admission.tenants)
    pod = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (mount,) = [m for m in init["volumeMounts"] if m["name"] == "config"]
    assert init["command"] == ["reins", "config", "apply"]
    assert init["args"] == [f"{mount['mountPath']}/{name}"]
    assert reins_env(init) == reins_env(container(docs, "router"))  # the same Redis and prefix
    for component in ("router", "worker", "api"):
        c = container(docs, component)
        assert "REINS_TENANTS_FILE" not in reins_env(c), "a process would read the file"
        assert "config" not in {m["name"] for m in c["volumeMounts"]}


def test_a_changed_configuration_rolls_the_routers_that_read_it_at_boot() -> None:
    def checksum(docs: tuple[dict[str, Any], ...]) -> str:
        pod = one(docs, "Deployment", "-router")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum(render()) == checksum(render())
    assert checksum(render()) != checksum(render("gates.config=" + GATES))


GATES = '[routes."openai/gpt-4o-mini"]\nrpm = 500\ntpm = 200000\nconcurrency = 64\n'


@pytest.mark.parametrize("sets", [(), ("worker.replicas=3", "gates.config=" + GATES)])
@pytest.mark.parametrize("component", ["router", "worker", "api"])
def test_commands_parse_with_the_reins_cli(component: str, sets: tuple[str, ...]) -> None:
    """The rendered command line is one the `reins` CLI accepts (parsed, not run)."""
    import typer
    import typer.main

    from ops.cli import admin as cli_admin
    from ops.cli import fleet as cli_fleet

    app = typer.Typer()
    cli_fleet.register(app)
    cli_admin.register(app)
    group = typer.main.get_command(app)
    docs = render(*sets)
    c = container(docs, component)
    assert c["command"][0] == "reins"
    assert "POD_NAME" in {e["name"] for e in c["env"]}
    assert "--name=$(POD_NAME)" in c["args"]
    command = group.commands[c["command"][1]]  # type: ignore[attr-defined]
    command.make_context(component, list(c["command"][2:]) + list(c["args"]))
    if component == "router":
        (init,) = one(docs, "Deployment", "-router")["spec"]["template"]["spec"]["initContainers"]
        config = group.commands["config"].commands["apply"]  # type: ignore[attr-defined]
        config.make_context("apply", list(init["args"]))
        data = one(docs, "ConfigMap", "-config")["data"]
        gate_args = [a.split("=", 1)[1] for a in init["args"] if a.startswith("--gates=")]
        assert len(gate_args) == (1 if sets else 0)
        for gates in gate_args:
            GateConfig.from_mapping(tomllib.loads(data[gates.rsplit("/", 1)[1]]))


def test_the_api_service_reaches_the_api_and_its_probes_ask_readyz() -> None:
    docs = render("api.port=9090")
    service = one(docs, "Service", "-api")
    pod = one(docs, "Deployment", "-api")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    c = container(docs, "api")
    (http,) = [p for p in c["ports"] if p["name"] == port["targetPort"]]
    assert http["containerPort"] == 9090 and "--port=9090" in c["args"]
    assert "--host=0.0.0.0" in c["args"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # no other Service selects the API's pods, and none points at a router port nobody serves
    router = container(docs, "router")
    assert "http" not in {p["name"] for p in router["ports"]}


def test_dashboard_configmap_holds_the_committed_json() -> None:
    cm = one(render(), "ConfigMap", "-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = cm["data"]["reins-fairness.json"]
    committed = DASHBOARD_PATH.read_text(encoding="utf-8")
    assert shipped == committed.rstrip("\n")
    assert json.loads(shipped)["uid"] == "reins-fairness"
    assert not [
        d for d in render("dashboard.enabled=false") if d["metadata"]["name"].endswith("-dashboard")
    ]


def test_metrics_are_scraped_by_annotations_or_service_monitor() -> None:
    docs = render("metrics.serviceMonitor.enabled=true")
    port = values()["metrics"]["port"]
    for component in ("router", "worker"):
        pod = one(docs, "Deployment", f"-{component}")["spec"]["template"]
        notes = pod["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert notes["prometheus.io/port"] == str(port)
        (p,) = [p for p in container(docs, component)["ports"] if p["name"] == "metrics"]
        assert p["containerPort"] == port
        # the process serves where the pod declares it, on every interface of the pod
        env = reins_env(container(docs, component))
        settings = Settings.from_env({k: e["value"] for k, e in env.items()})
        assert (settings.metrics_port, settings.metrics_host) == (port, "0.0.0.0")
    moved = render("metrics.port=9300")
    for component in ("router", "worker"):
        c = container(moved, component)
        assert reins_env(c)["REINS_METRICS_PORT"]["value"] == "9300"
        assert [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"] == [9300]
    monitor = one(docs, "ServiceMonitor", "r-reins")
    wanted = monitor["spec"]["selector"]["matchLabels"]
    scraped = [
        d
        for d in docs
        if d["kind"] == "Service" and wanted.items() <= d["metadata"]["labels"].items()
    ]
    assert sorted(d["metadata"]["name"] for d in scraped) == [
        "r-reins-router",
        "r-reins-worker-metrics",
    ]
    for svc in scraped:
        assert "metrics" in [p["name"] for p in svc["spec"]["ports"]]
    router_ports = {p["name"] for p in one(docs, "Service", "-router")["spec"]["ports"]}
    assert router_ports == {"metrics"}


@pytest.mark.parametrize("component", ["router", "worker"])
def test_probes_ask_the_process_on_its_health_port(component: str) -> None:
    c = container(render(), component)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["health"] == values()["health"]["port"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "health"}
    env = reins_env(c)
    assert env["REINS_HEALTH_PORT"]["value"] == str(values()["health"]["port"])


def test_the_worker_label_is_the_deployments_name_not_the_pods() -> None:
    docs = render()
    deployment = one(docs, "Deployment", "-worker")["metadata"]["name"]
    label = reins_env(container(docs, "worker"))["REINS_METRICS_WORKER_LABEL"]["value"]
    assert label == deployment == "r-reins-worker"
    assert Settings.from_env({"REINS_METRICS_WORKER_LABEL": label}).metrics_worker_label == label
    chosen = render("metrics.workerLabel=workers-eu")
    assert reins_env(container(chosen, "worker"))["REINS_METRICS_WORKER_LABEL"]["value"] == (
        "workers-eu"
    )


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("worker.replicas=abc", "worker.replicas"),
        ("worker.concurrency=0", "worker.concurrency"),
        ("metrics.port=70000", "metrics.port"),
        ("store.redisUrl=http://cache:6379", "store.redisUrl"),
        ("router.replicas=0", "router.replicas"),
        ("worker.podDisruptionBudget.maxUnavailable=0", "worker.podDisruptionBudget"),
        ("topologySpread[0].whenUnsatisfiable=Sometimes", "whenUnsatisfiable"),
        ("serviceAccount.automountToken=maybe", "serviceAccount.automountToken"),
    ],
)
def test_the_schema_refuses_a_bad_value_naming_it(bad: str, named: str) -> None:
    done = helm("template", "r", str(CHART), "--set", bad)
    assert done.returncode != 0 and not done.stdout
    assert "values don't meet the specifications of the schema" in done.stderr
    assert named in done.stderr, done.stderr


def test_pdbs_probes_service_account_and_spread_by_default() -> None:
    docs = render()
    account = one(docs, "ServiceAccount", "r-reins")
    assert account["automountServiceAccountToken"] is False
    for component in ("router", "api", "worker"):
        deployment = one(docs, "Deployment", f"-{component}")
        pod = deployment["spec"]["template"]
        labels = deployment["spec"]["selector"]["matchLabels"]
        pdb = one(docs, "PodDisruptionBudget", f"-{component}")
        assert pdb["spec"]["selector"]["matchLabels"] == labels
        assert pdb["spec"]["maxUnavailable"] == 1
        spec = pod["spec"]
        assert spec["serviceAccountName"] == account["metadata"]["name"]
        assert spec["automountServiceAccountToken"] is False
        spread = spec["topologySpreadConstraints"]
        assert {c["topologyKey"] for c in spread} == {
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
        }
        assert all(c["labelSelector"]["matchLabels"] == labels for c in spread)
        assert labels.items() <= pod["metadata"]["labels"].items()
        c = container(docs, component)
        ports = {p["name"] for p in c["ports"]}
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] in ports, (component, probe)
        assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]}
    off = render("worker.podDisruptionBudget.enabled=false")
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget" and "worker" in str(d)]


def images(docs: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The image of every container and init container, by component/container."""
    out = {}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        component = d["metadata"]["labels"]["app.kubernetes.io/component"]
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            out[f"{component}/{c['name']}"] = c["image"]
    return out


def test_a_schema_upgrade_moves_routers_and_the_api_first_then_workers() -> None:
    """README, "Drain, crashes and rolling deploys": the two documented steps, as rendered."""
    old, new = "0.1.0", "0.2.0"
    before = images(render(f"image.tag={old}"))
    assert set(before.values()) == {f"ghcr.io/reins/reins:{old}"}
    step1 = images(render(f"image.tag={new}", f"worker.imageTag={old}"))
    assert {k: v.rsplit(":", 1)[1] for k, v in step1.items()} == {
        k: old if k.startswith("worker/") else new for k in before
    }
    step2 = images(render(f"image.tag={new}"))
    assert set(step2.values()) == {f"ghcr.io/reins/reins:{new}"}


INGRESS = ("ingress.enabled=true", "ingress.host=reins.example.com")


def test_no_ingress_by_default_and_the_public_url_is_then_the_requests() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "Ingress"]
    assert reins_env(container(docs, "api"))["REINS_PUBLIC_URL"]["value"] == ""


def test_an_ingress_with_tls_reaches_the_api_and_makes_the_public_url_https() -> None:
    docs = render(*INGRESS, "ingress.tls.secretName=reins-tls", "ingress.className=nginx")
    ingress = one(docs, "Ingress", "-api")
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["reins.example.com"], "secretName": "reins-tls"}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "reins.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")  # the API and its /ui
    backend = path["backend"]["service"]
    service = one(docs, "Service", "-api")
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    for component in ("api", "router", "worker"):
        env = reins_env(container(docs, component))
        settings = Settings.from_env({k: e["value"] for k, e in env.items()})
        assert settings.public_url == "https://reins.example.com", component

    plain = render(*INGRESS)
    assert "tls" not in one(plain, "Ingress", "-api")["spec"]
    env = reins_env(container(plain, "api"))
    assert env["REINS_PUBLIC_URL"]["value"] == "http://reins.example.com"
    chosen = render(*INGRESS, "ingress.tls.secretName=t", "api.publicUrl=https://agents.example")
    env = reins_env(container(chosen, "api"))
    assert env["REINS_PUBLIC_URL"]["value"] == "https://agents.example"


def test_trusted_proxies_reach_the_api_as_a_setting_it_accepts() -> None:
    docs = render("api.trustedProxies={10.0.0.0/8,fd00::/8}")
    env = reins_env(container(docs, "api"))
    settings = Settings.from_env({k: e["value"] for k, e in env.items()})
    assert settings.proxies() == ["10.0.0.0/8", "fd00::/8"]
    assert reins_env(container(render(), "api"))["REINS_TRUSTED_PROXIES"]["value"] == ""


@pytest.mark.parametrize(
    ("sets", "named"),
    [
        (("ingress.tls.enabled=true",), "ingress.tls: secretName is required"),
        (("ingress.tls.secretName=",), "ingress.tls.secretName"),
        (("ingress.tls.secret=reins-tls",), "ingress.tls: secretName is required"),
        (("ingress.enabled=yes",), "ingress.enabled"),
        (("ingress.hosts=reins.example.com",), "ingress: Additional property hosts"),
        (("api.publicUrl=https://reins.example.com/ui",), "api.publicUrl"),
        (("api.trustedProxies={proxy.local}",), "api.trustedProxies"),
    ],
)
def test_the_schema_refuses_a_bad_ingress_or_front_door_value_naming_it(
    sets: tuple[str, ...], named: str
) -> None:
    args = [a for s in (*INGRESS, *sets) for a in ("--set", s)]
    done = helm("template", "r", str(CHART), *args)
    assert done.returncode != 0 and not done.stdout
    assert "values don't meet the specifications of the schema" in done.stderr
    assert named in done.stderr, done.stderr


def test_an_ingress_without_a_host_is_refused_naming_it() -> None:
    done = helm("template", "r", str(CHART), "--set", "ingress.enabled=true")
    assert done.returncode != 0 and "ingress.host is required" in done.stderr, done.stderr


def test_provider_keys_come_from_secrets_by_reference() -> None:
    """A route's key reaches the workers from a Secret, as a variable or a mounted file; the
    chart renders only the references (docs/adr/0201-model-routes.md)."""
    docs = render(
        "worker.providerKeys[0].env=OPENAI_API_KEY",
        "worker.providerKeys[0].secret=openai",
        "worker.providerKeys[0].key=api-key",
        "worker.providerKeys[1].mountPath=/var/run/secrets/anthropic",
        "worker.providerKeys[1].secret=anthropic",
    )
    worker = container(docs, "worker")
    env = {e["name"]: e for e in worker["env"]}
    assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "openai",
        "key": "api-key",
    }
    assert "value" not in env["OPENAI_API_KEY"]
    mounts = {m["name"]: m for m in worker["volumeMounts"]}
    assert mounts["provider-key-1"] == {
        "name": "provider-key-1",
        "mountPath": "/var/run/secrets/anthropic",
        "readOnly": True,
    }
    pod = one(docs, "Deployment", "-worker")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["provider-key-1"]["secret"] == {"secretName": "anthropic"}
    assert "OPENAI_API_KEY" not in {e["name"] for e in container(docs, "router")["env"]}


def test_a_provider_key_without_its_secret_is_refused() -> None:
    done = helm("template", "r", str(CHART), "--set", "worker.providerKeys[0].env=OPENAI_API_KEY")
    assert done.returncode != 0 and not done.stdout
    assert "providerKeys" in done.stderr, done.stderr
