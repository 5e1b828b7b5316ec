"""deploy/ and the Containerfile: the image recipe, the rendered Kubernetes manifests (the base and every
combination of its components) and the systemd unit agree with each other and with the real config.

Nothing here is a copy of the manifests' values: ports, paths, users and timeouts are read from the files
and checked against the settings the daemon would actually load, so editing one file without the other
fails. The manifests are rendered by the real `kubectl kustomize` (tests/kustomize.py), under another
namespace than the default, and validated against the Kubernetes API schemas in strict mode
(kubernetes-validate).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import tomllib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

import warmer
from tests.kustomize import BASE, COMPONENTS, KUBERNETES, KustomizeError, compose, render
from tests.metric_names import exported_sample_names, warmer_metrics_in
from warmer.cli import main
from warmer.cli.exits import Exit
from warmer.cli.init import starter_files
from warmer.config.loader import LoadedConfig, load_config
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = KUBERNETES / "overlays" / "example"
SYSTEMD = REPO / "deploy" / "systemd"
CONTAINERFILE = REPO / "Containerfile"
# The Kubernetes release the manifests are validated against (kubernetes-validate ships its schemas).
KUBERNETES_VERSION = "1.32.0"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
# Where the combinations are rendered: not `default`, so a manifest that only works there fails.
NAMESPACE = "warmer-system"
# Every subset of the components, in the order the example overlay lists them.
COMBINATIONS = [
    combination
    for size in range(len(COMPONENTS) + 1)
    for combination in itertools.combinations(COMPONENTS, size)
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifests' environment only: nothing leaks in from the shell running the tests."""
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------------------------------- Kubernetes


def _one(kind: str, manifests: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    found = [doc for doc in manifests if doc.get("kind") == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _secret_example(components: tuple[str, ...]) -> dict[str, Any]:
    """The example Secret an operator applies with these components (PostgreSQL's adds the URL)."""
    directory = KUBERNETES / "components" / "postgresql" if "postgresql" in components else BASE
    (secret,) = [doc for doc in yaml.safe_load_all((directory / "secret.example.yaml").read_text()) if doc]
    return dict(secret)


_RENDERED: dict[tuple[str, ...], list[dict[str, Any]]] = {}


def _name(combination: tuple[str, ...]) -> str:
    return "+".join(combination) or "base"


def _with(component: str) -> list[tuple[str, ...]]:
    """The combinations that include `component`."""
    return [combination for combination in COMBINATIONS if component in combination]


@pytest.fixture(params=COMBINATIONS, ids=_name)
def variant(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """Each combination of components in turn, over the single-replica base."""
    return tuple(request.param)


@pytest.fixture
def manifests(variant: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The combination rendered by kubectl kustomize in NAMESPACE (once per test session)."""
    if variant not in _RENDERED:
        root = tmp_path_factory.mktemp("overlay")
        _RENDERED[variant] = render(compose(root, variant, NAMESPACE))
    return json.loads(json.dumps(_RENDERED[variant]))  # a copy a test may change


def _container(manifests: list[dict[str, Any]], name: str = "warmer") -> dict[str, Any]:
    pod = _one("Deployment", manifests)["spec"]["template"]["spec"]
    found = [c for c in [*pod["containers"], *pod.get("initContainers", [])] if c["name"] == name]
    assert len(found) == 1
    return dict(found[0])


def _named_port(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's or Service's `port`/`targetPort` (number or port name) as the container's port number."""
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert numbers, f"no container port named {port!r}"
    return int(numbers[0])


def _config_path_in_args(args: list[str]) -> PurePosixPath:
    return PurePosixPath(args[args.index("--config") + 1])


def _container_env(container: Mapping[str, Any], secret: Mapping[str, Any] | None) -> dict[str, str]:
    """The container's environment: literal values, the Secret's keys (envFrom, secretKeyRef), with the
    shipped example Secret standing in for the real one. A secretKeyRef to a missing key fails, as the
    pod would not start."""
    data: Mapping[str, str] = secret["stringData"] if secret is not None else {}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "secretRef" in source:
            assert secret is not None
            assert source["secretRef"]["name"] == secret["metadata"]["name"]
            env.update(data)
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item.get("valueFrom", {}):
            ref = item["valueFrom"]["secretKeyRef"]
            assert secret is not None
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in data or ref.get("optional"), f"the Secret has no key {ref['key']!r}"
            if ref["key"] in data:
                env[item["name"]] = data[ref["key"]]
    return env


def _materialize_pod_files(
    manifests: list[dict[str, Any]], root: Path, container_name: str = "warmer"
) -> Path:
    """Write the files the container sees (ConfigMap keys at their mount paths and `items` paths, empty
    dirs for other volumes) under `root`.

    Absolute paths inside the config file are re-rooted at `root`, so the loader finds exactly the files
    the pod would: an agent file the volume does not place is then a missing file here too.
    Returns the config file named by the container's `--config`.
    """
    pod = _one("Deployment", manifests)["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    container = _container(manifests, container_name)
    config_file = _config_path_in_args(container["args"])
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        if "configMap" not in volume:
            target.mkdir(parents=True, exist_ok=True)
            continue
        config_map = _one("ConfigMap", manifests, volume["configMap"]["name"])
        data: Mapping[str, str] = config_map["data"]
        items = volume["configMap"].get("items") or [{"key": key, "path": key} for key in data]
        for item in items:
            assert item["key"] in data, f"no ConfigMap key {item['key']!r} to mount"
            path = target / item["path"]
            text = data[item["key"]]
            if PurePosixPath("/" + str(path.relative_to(root))) == config_file:
                text = text.replace('"/', f'"{root.as_posix()}/')
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root / str(config_file).lstrip("/")


@pytest.fixture
def pod_config(
    manifests: list[dict[str, Any]],
    variant: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The pod's config file on disk, with the environment the Deployment gives the container."""
    for name, value in _container_env(_container(manifests), _secret_example(variant)).items():
        monkeypatch.setenv(name, value)
    return _materialize_pod_files(manifests, tmp_path)


@pytest.fixture
def pod_loaded(pod_config: Path) -> LoadedConfig:
    return load_config(pod_config)


def test_rendered_manifests_and_secret_examples_pass_strict_schema_validation(
    manifests: list[dict[str, Any]], variant: tuple[str, ...]
) -> None:
    """Built-in kinds against the Kubernetes API schemas, unknown fields rejected. The Prometheus
    Operator's kinds have no schema there; their fields are checked by the monitoring tests below."""
    crds = {"ServiceMonitor", "PrometheusRule"}
    for document in [*manifests, _secret_example(variant)]:
        if document["kind"] in crds:
            assert document["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    kinds = {doc["kind"] for doc in manifests}
    assert kinds >= {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount"}
    assert ({"ServiceMonitor", "PrometheusRule"} <= kinds) == ("monitoring" in variant)
    assert ("NetworkPolicy" in kinds) == ("network-policy" in variant)
    assert ({"Role", "RoleBinding"} <= kinds) == ("discovery" in variant)
    assert ("PersistentVolumeClaim" in kinds) == ("postgresql" not in variant)


def test_the_base_needs_no_crd_and_no_namespace() -> None:
    """`kubectl apply -k base` works on a bare cluster: only built-in kinds, nothing pinned to a
    namespace, so `kubectl -n NS apply -k` places it."""
    manifests = render(BASE)
    for document in manifests:
        assert "/" not in document["apiVersion"] or document["apiVersion"].split("/")[0].endswith(
            ("apps", "policy")
        ), document["kind"]
        assert "namespace" not in document["metadata"], document["kind"]


def test_every_resource_lands_in_warmers_namespace_but_the_discovery_rbac(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig
) -> None:
    discovery = pod_loaded.settings.fleet.discovery
    for document in manifests:
        expected = NAMESPACE
        if document["kind"] in {"Role", "RoleBinding"}:
            assert discovery is not None
            expected = discovery.namespace
        assert document["metadata"]["namespace"] == expected, document["kind"]


def test_strict_validation_rejects_an_unknown_field() -> None:
    """The validation above can fail: a misspelt field in a rendered Deployment is an error."""
    deployment = _one("Deployment", render(BASE))
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomize_errors_are_reported(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(KustomizeError, match=r"missing\.yaml"):
        render(tmp_path)


def test_configmap_config_passes_the_real_validation(pod_loaded: LoadedConfig) -> None:
    assert pod_loaded.boxes, "the example fleet has at least one box"
    assert {box.model for box in pod_loaded.boxes} <= set(pod_loaded.profiles)
    assert list(pod_loaded.agents) == ["example"], "the nested agent files reach their paths"
    assert not pod_loaded.settings.api.binds_loopback, "a pod must be reachable from the Service"


def test_configmap_agent_is_what_warmer_init_writes(manifests: list[dict[str, Any]]) -> None:
    written = starter_files(model="dense-sglang", engine="sglang", box_urls=(), port=8470)
    volume = next(
        v for v in _one("Deployment", manifests)["spec"]["template"]["spec"]["volumes"] if "configMap" in v
    )
    data = _one("ConfigMap", manifests, volume["configMap"]["name"])["data"]
    placed = {f"{item['path']}": data[item["key"]] for item in volume["configMap"]["items"]}
    assert {path: text for path, text in placed.items() if path.startswith("agents/")} == {
        path: text for path, text in written.items() if path.startswith("agents/")
    }


def test_container_command_checks_out_with_check_config(
    manifests: list[dict[str, Any]], pod_config: Path
) -> None:
    """The container's own args, with `serve` swapped for `check-config`, pass the real CLI."""
    args = list(_container(manifests)["args"])
    assert args[-1] == "serve"
    assert args[0] == "--config", "--config is a group option: it comes before the subcommand"
    args[args.index("--config") + 1] = str(pod_config)
    result = CliRunner().invoke(main, [*args[:-1], "check-config"])
    assert result.exit_code == 0, result.output
    assert "config ok" in result.output


def test_the_secret_is_what_makes_the_config_valid(manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    """Without the Secret's tokens the pod's routable bind is refused: the envFrom is load-bearing."""
    container = _container(manifests)
    assert any(source.get("secretRef", {}).get("name") for source in container.get("envFrom", []))
    with pytest.raises(ConfigError) as caught:
        load_config(_materialize_pod_files(manifests, tmp_path))
    assert "api.tokens" in [path for path, _ in caught.value.problems]


def test_probes_hit_health_endpoints_on_the_api_port(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig
) -> None:
    container = _container(manifests)
    api_port = pod_loaded.settings.api.port
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    assert _named_port(container, liveness["port"]) == api_port
    assert _named_port(container, readiness["port"]) == api_port
    startup = container["startupProbe"]["httpGet"]
    assert startup["path"] == "/healthz", "start-up must not wait on /readyz (engines may be cold)"
    assert _named_port(container, startup["port"]) == api_port


def test_service_pdb_and_account_select_the_pods(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig
) -> None:
    container = _container(manifests)
    deployment = _one("Deployment", manifests)
    pod = deployment["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    service = _one("Service", manifests)
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert (
        _one("PodDisruptionBudget", manifests)["spec"]["selector"]["matchLabels"].items()
        <= pod_labels.items()
    )
    for port in service["spec"]["ports"]:
        assert _named_port(container, port.get("targetPort", port["port"])) == pod_loaded.settings.api.port
    assert pod["spec"]["serviceAccountName"] == _one("ServiceAccount", manifests)["metadata"]["name"]


def test_termination_grace_outlasts_the_shutdown_grace(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig
) -> None:
    pod = _one("Deployment", manifests)["spec"]["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)  # Kubernetes' default
    assert grace > pod_loaded.settings.reconcile.shutdown_grace_seconds


def test_every_container_runs_the_image_the_containerfile_builds(manifests: list[dict[str, Any]]) -> None:
    pod = _one("Deployment", manifests)["spec"]["template"]["spec"]
    images = {container["image"] for container in [*pod["containers"], *pod.get("initContainers", [])]}
    assert images == {f"warmer:{VERSION}"}
    assert "-t warmer:$(VERSION)" in (REPO / "Makefile").read_text()


def test_base_keeps_the_embedded_database_on_a_one_pod_volume_claim(pod_loaded: LoadedConfig) -> None:
    manifests = render(BASE)
    deployment = _one("Deployment", manifests)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate", "never two writers on one SQLite file"
    claim_manifest = _one("PersistentVolumeClaim", manifests)
    assert claim_manifest["spec"]["accessModes"] == ["ReadWriteOncePod"], "the cluster enforces one writer"
    claim = claim_manifest["metadata"]["name"]
    pod = deployment["spec"]["template"]["spec"]
    state = next(v for v in pod["volumes"] if v.get("persistentVolumeClaim", {}).get("claimName") == claim)
    mount = next(m for m in _container(manifests)["volumeMounts"] if m["name"] == state["name"])
    if pod_loaded.settings.database.is_embedded:  # the base variant's own pod config
        assert PurePosixPath(mount["mountPath"]).name == pod_loaded.settings.database.state_dir.name


def test_postgresql_component_runs_replicas_on_the_server_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifests = render(compose(tmp_path / "overlay", ["postgresql"]))
    deployment = _one("Deployment", manifests)
    assert deployment["spec"]["replicas"] > 1
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not [doc for doc in manifests if doc["kind"] == "PersistentVolumeClaim"]
    pod = deployment["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    secret = _secret_example(("postgresql",))
    for name in ("migrate", "warmer"):
        env = _container_env(_container(manifests, name), secret)
        assert env["WARMER_DATABASE__URL"].startswith("postgresql+psycopg://")
    migrate = _container(manifests, "migrate")["args"]
    assert migrate[-2:] == ["db", "upgrade"]
    assert _config_path_in_args(migrate) == _config_path_in_args(_container(manifests)["args"])
    for name, value in _container_env(_container(manifests), secret).items():
        monkeypatch.setenv(name, value)
    loaded = load_config(_materialize_pod_files(manifests, tmp_path / "pod"))
    assert not loaded.settings.database.is_embedded


def _egress_allows(policies: list[dict[str, Any]], namespace: str, port: int) -> bool:
    """Whether some egress rule of `policies` lets the pod reach `port` in `namespace`."""
    for policy in policies:
        for rule in policy["spec"].get("egress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            peers = rule.get("to", [{"namespaceSelector": {}}])
            names = [peer.get("namespaceSelector", {}).get("matchLabels", {}) for peer in peers]
            if port in ports and any(n in ({}, {"kubernetes.io/metadata.name": namespace}) for n in names):
                return True
    return False


def _service_namespace(url: str) -> str:
    """The namespace of a cluster Service URL (`http://name.NAMESPACE.svc...`)."""
    host = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
    labels = host.split(".")
    assert "svc" in labels, f"{host} is not a cluster Service name"
    return labels[labels.index("svc") - 1]


def _port(url: str) -> int:
    authority = url.split("://", 1)[1].split("/", 1)[0]
    return int(authority.rsplit(":", 1)[1])


@pytest.mark.parametrize("variant", _with("network-policy"), ids=_name)
def test_network_policy_admits_the_api_and_reaches_every_address_of_the_config(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig, variant: tuple[str, ...]
) -> None:
    """Each combination's config, read as the pod would: every box, discovered engine port, gateway,
    KV-event socket, the API server and the database are allowed out; the API port in."""
    container = _container(manifests)
    policies = [doc for doc in manifests if doc["kind"] == "NetworkPolicy"]
    pod_labels = _one("Deployment", manifests)["spec"]["template"]["metadata"]["labels"]
    assert all(p["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items() for p in policies)
    ingress_ports = {
        _named_port(container, port["port"])
        for p in policies
        for rule in p["spec"].get("ingress", [])
        for port in rule["ports"]
    }
    assert pod_loaded.settings.api.port in ingress_ports
    assert _egress_allows(policies, "kube-system", 53), "DNS"
    fleet = pod_loaded.settings.fleet
    for box in fleet.boxes:
        assert _egress_allows(policies, _service_namespace(box.base_url), _port(box.base_url)), box.id
        if box.kv_events is not None:
            for endpoint in (box.kv_events.endpoint, box.kv_events.replay_endpoint):
                if endpoint:
                    assert _egress_allows(policies, _service_namespace(box.base_url), _port(endpoint))
    if fleet.gateway is not None:
        gateway = fleet.gateway.url
        assert _egress_allows(policies, _service_namespace(gateway), _port(gateway)), "gateway"
    if fleet.discovery is not None:
        assert _egress_allows(policies, fleet.discovery.namespace, fleet.discovery.port), "discovered pods"
        assert _egress_allows(policies, "default", 443), "the Kubernetes API"
    if not pod_loaded.settings.database.is_embedded:
        assert _egress_allows(policies, "database", _port(pod_loaded.settings.database_url())), "PostgreSQL"


@pytest.mark.parametrize("engine_port", [30000, 8000, 8080])
def test_network_policy_lets_every_engine_port_through(engine_port: int, tmp_path: Path) -> None:
    """SGLang, vLLM and llama-server boxes in the engines' namespace are all reachable, not only SGLang's."""
    manifests = render(compose(tmp_path, ["network-policy"]))
    policies = [doc for doc in manifests if doc["kind"] == "NetworkPolicy"]
    assert _egress_allows(policies, "inference", engine_port)
    assert not _egress_allows(policies, "inference", 22), "the egress is not open"
    otlp = Settings(tracing={"enabled": True}).tracing.otlp_endpoint
    assert _egress_allows(policies, "monitoring", _port(otlp)), "traces reach a collector when switched on"


@pytest.mark.parametrize("variant", _with("discovery"), ids=_name)
def test_discovery_may_watch_the_engine_pods_from_another_namespace(
    manifests: list[dict[str, Any]], pod_loaded: LoadedConfig, variant: tuple[str, ...]
) -> None:
    """The Role and RoleBinding stay in the engines' namespace and bind warmer's ServiceAccount in its own
    namespace, whatever that is; the settings come as environment variables merged over any warmer.toml."""
    discovery = pod_loaded.settings.fleet.discovery
    assert discovery is not None, "the component's variables reach [fleet.discovery]"
    assert pod_loaded.boxes, "and the configured boxes of the ConfigMap are still there"
    pod = _one("Deployment", manifests)["spec"]["template"]["spec"]
    account = _one("ServiceAccount", manifests)
    assert pod["automountServiceAccountToken"] is True
    assert account["automountServiceAccountToken"] is True
    assert discovery.token_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    role = _one("Role", manifests)
    binding = _one("RoleBinding", manifests)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == discovery.namespace
    assert discovery.namespace != NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert any(
        "" in rule["apiGroups"] and "pods" in rule["resources"] and {"list", "watch"} <= set(rule["verbs"])
        for rule in role["rules"]
    )


def test_the_example_overlay_composes_every_component_in_its_own_namespace() -> None:
    manifests = render(EXAMPLE)
    kustomization = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())
    assert [Path(c).name for c in kustomization["components"]] == list(COMPONENTS)
    (transformer,) = [yaml.safe_load(text) for text in kustomization["transformers"]]
    namespace = transformer["metadata"]["namespace"]
    binding = _one("RoleBinding", manifests)
    assert binding["metadata"]["namespace"] == "inference"
    assert (
        binding["subjects"][0]["namespace"]
        == namespace
        == _one("Deployment", manifests)["metadata"]["namespace"]
    )
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _one(kind, manifests)["metadata"]["labels"]["release"] == "prometheus", "the label is settable"


# Fields the Prometheus Operator's CRDs define (example/prometheus-operator-crd/
# monitoring.coreos.com_prometheusrules.yaml @ 2de7fa35f1dae33ca3dfc392b27dbf06a93d5c4d and
# monitoring.coreos.com_servicemonitors.yaml @ c5bfb15ae2f365b7dd960ac7a40297c3bfc4b044 in
# prometheus-operator/prometheus-operator), with its duration pattern for `for:`.
_RULE_FIELDS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
_DURATION = re.compile(
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)


@pytest.fixture
def monitored(tmp_path: Path) -> list[dict[str, Any]]:
    return render(compose(tmp_path, ["monitoring"], NAMESPACE))


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("warmer_deploy_build", REPO / "deploy" / "build.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_monitoring_files_are_the_builders_output() -> None:
    for path, text in _builder().outputs().items():
        assert path.read_text() == text, f"{path.name}: run python deploy/build.py"


def test_service_monitor_and_rules_carry_the_prometheus_selector_label(
    monitored: list[dict[str, Any]],
) -> None:
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert _one(kind, monitored)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar(monitored: list[dict[str, Any]]) -> None:
    (dashboard,) = [d for d in monitored if d["kind"] == "ConfigMap" and "warmer.json" in d.get("data", {})]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["warmer.json"] == (REPO / "deploy" / "grafana" / "warmer.json").read_text()
    variables = {v["name"] for v in json.loads(dashboard["data"]["warmer.json"])["templating"]["list"]}
    assert {"namespace", "job"} <= variables


def test_the_rule_file_and_the_prometheus_rule_hold_the_same_rules(monitored: list[dict[str, Any]]) -> None:
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "warmer.rules.yml").read_text())
    assert _one("PrometheusRule", monitored)["spec"] == rules


def test_service_monitor_scrapes_the_metrics_endpoint(monitored: list[dict[str, Any]]) -> None:
    manifests = monitored
    monitor = _one("ServiceMonitor", manifests)
    service = _one("Service", manifests)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout"}
        assert endpoint["port"] in service_ports
        assert endpoint["path"] == "/metrics"
        assert _DURATION.match(endpoint["interval"])


def test_alerts_cover_readiness_health_root_tasks_absence_sync_discovery_and_scrapes(
    monitored: list[dict[str, Any]],
) -> None:
    rules = [rule for group in _one("PrometheusRule", monitored)["spec"]["groups"] for rule in group["rules"]]
    exported = exported_sample_names()
    read: set[str] = set()
    for rule in rules:
        assert set(rule) <= _RULE_FIELDS, rule
        assert _DURATION.match(rule.get("for", "0")), rule
        names = warmer_metrics_in(rule["expr"])
        assert names, f"{rule['alert']} reads no warmer metric"
        assert names <= exported, f"{rule['alert']} reads metrics warmer does not export: {names - exported}"
        for text in rule.get("annotations", {}).values():
            assert warmer_metrics_in(text) <= exported, text
        read |= names
    assert {
        "warmer_box_ready",
        "warmer_box_health_failure",
        "warmer_box_gate_released",
        "warmer_box_hit_rate_below_threshold",
        "warmer_root_task_failures_total",
        "warmer_up",
        "warmer_gateway_sync_passes_total",
        "warmer_discovery_listings_total",
        "warmer_cache_scrapes_total",
    } <= read


def test_alert_metric_check_catches_a_misspelt_metric() -> None:
    assert warmer_metrics_in("max by (box) (warmer_box_readyy) == 0") - exported_sample_names()


# ------------------------------------------------------------------------------------- Containerfile


def _final_stage() -> list[tuple[str, str]]:
    """The Containerfile's last stage as (INSTRUCTION, arguments), continuation lines joined."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, arguments = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:  # a global ARG before the first FROM (the base) belongs to no stage
            stages[-1].append((instruction.upper(), arguments.strip()))
    return stages[-1]


def _instruction(stage: list[tuple[str, str]], name: str) -> str:
    values = [arguments for instruction, arguments in stage if instruction == name]
    assert values, f"{name} missing from the final stage"
    return values[-1]


def test_image_runs_as_the_pods_non_root_user_on_the_api_port() -> None:
    manifests = render(BASE)
    stage = _final_stage()
    pod_security = _one("Deployment", manifests)["spec"]["template"]["spec"]["securityContext"]
    user, _, group = _instruction(stage, "USER").partition(":")
    assert int(user) == pod_security["runAsUser"] != 0
    assert int(group) == pod_security["runAsGroup"]
    container = _container(manifests)
    assert int(_instruction(stage, "EXPOSE")) == _named_port(container, "http")
    assert yaml.safe_load(_instruction(stage, "ENTRYPOINT")) == ["warmer"]
    assert yaml.safe_load(_instruction(stage, "CMD")) == container["args"]


# Fully qualified: podman and buildah need no short-name alias to resolve it.
_DIGEST = re.compile(
    r"^ARG BASE=(docker\.io/library/python:3\.11[.\d]*-slim-bookworm)@sha256:[0-9a-f]{64}$", re.MULTILINE
)


def test_every_stage_starts_from_the_one_base_pinned_by_digest() -> None:
    """A rebuild gets the same base bytes whatever its tag points to later."""
    text = CONTAINERFILE.read_text()
    (base,) = _DIGEST.findall(text)
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert froms == ["${BASE}", "${BASE}"]
    labels = _labels()
    assert labels["org.opencontainers.image.base.name"] == base


def _labels() -> dict[str, str]:
    """The final stage's OCI labels, with the ARG defaults substituted."""
    stage = _final_stage()
    defaults = dict(arguments.partition("=")[::2] for instruction, arguments in stage if instruction == "ARG")
    labels: dict[str, str] = {}
    for part in shlex.split(_instruction(stage, "LABEL")):
        key, _, value = part.partition("=")
        labels[key] = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], value)
    return labels


def test_the_image_carries_oci_labels_matching_the_project() -> None:
    labels = _labels()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    assert labels["org.opencontainers.image.version"] == VERSION, "the default build arg is the version"
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    for name in ("VERSION", "REVISION", "CREATED"):
        assert f"--build-arg {name}=" in (REPO / "Makefile").read_text(), f"make image sets {name}"


def _pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", line)
        if match:
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_the_final_stage_installs_the_wheel_over_hash_locked_dependencies() -> None:
    stage = _final_stage()
    copies = [arguments for instruction, arguments in stage if instruction == "COPY"]
    assert copies == ["--from=wheel /dist/ /tmp/dist/", "requirements.lock /tmp/requirements.lock"]
    install = _instruction(stage, "RUN")
    pip = "pip install --no-cache-dir --disable-pip-version-check"
    assert f"{pip} --require-hashes -r /tmp/requirements.lock" in install
    assert f"{pip} --no-deps /tmp/dist/warmer-*.whl" in install
    lock = (REPO / "requirements.lock").read_text()
    assert "file://" not in lock, "no machine-local index in the lock"
    assert "--find-links" not in lock
    for block in re.split(r"\n(?=[A-Za-z])", lock.split("\n", 6)[-1]):
        if "==" in block:
            assert "--hash=sha256:" in block, block.splitlines()[0]
    assert _pins(lock) == _pins((REPO / "constraints.txt").read_text()), "make constraints writes both"


def test_the_build_stage_copies_what_the_wheel_needs() -> None:
    text = CONTAINERFILE.read_text()
    build = text[: text.rindex("\nFROM ")]
    copied = {part for line in build.splitlines() if line.startswith("COPY ") for part in line.split()[1:-1]}
    assert copied == {"pyproject.toml", "setup.py", "README.md", "warmer", "models", "migrations"}
    assert all((REPO / name).exists() for name in copied)
    assert warmer.__version__ == VERSION


def test_the_build_context_holds_only_what_the_containerfile_copies() -> None:
    """.dockerignore excludes everything, then lets in exactly the COPY sources of the build context."""
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "deny by default: a new file stays out of the context"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    sources = {
        part.rstrip("/")
        for line in CONTAINERFILE.read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for part in line.split()[1:-1]
    }
    assert allowed == sources


# --------------------------------------------------------------------------------------------- systemd


def _unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """A systemd unit as section -> [(key, value)] in order (keys may repeat, e.g. SystemCallFilter)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: setting outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def _last(section: list[tuple[str, str]], key: str) -> str:
    values = [value for name, value in section if name == key]
    assert values, f"{key}= missing"
    return values[-1]


def _timespan_seconds(value: str) -> float:
    """systemd time span (`20`, `20s`, `1min 30s`, `2m`) in seconds; bare numbers are seconds."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total = 0.0
    for part in value.split():
        number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = part[len(number) :] or "s"
        total += float(number) * units[unit]
    return total


def _env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = value.strip()
    return env


def _systemd_settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings from the shipped EnvironmentFile over the defaults (the TOML is the operator's)."""
    for name, value in _env_file(SYSTEMD / "warmer.env").items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_unit_runs_warmer_serve_with_the_config_option() -> None:
    service = _unit(SYSTEMD / "warmer.service")["Service"]
    argv = shlex.split(_last(service, "ExecStart"))
    assert PurePosixPath(argv[0]).name == "warmer"
    assert argv[-1] == "serve"
    assert "--config" in argv[1:-1], "the group's --config comes before the subcommand"
    assert {"serve", "check-config"} <= set(main.commands)
    for name, value in service:
        if name == "ExecStartPre" and "warmer" in value:
            pre = shlex.split(value.lstrip("-"))
            assert pre[-1] in main.commands
            assert _config_path_in_args(pre) == _config_path_in_args(argv), "check the file serve reads"


def test_unit_restarts_on_failure_and_reads_the_shipped_env_file() -> None:
    service = _unit(SYSTEMD / "warmer.service")["Service"]
    assert _last(service, "Restart") == "on-failure"
    assert int(_last(service, "RestartPreventExitStatus")) == Exit.CONFIG, "a bad config is not retried"
    env_file = PurePosixPath(_last(service, "EnvironmentFile").lstrip("-"))
    assert (SYSTEMD / env_file.name).is_file(), f"{env_file.name} is shipped next to the unit"


def test_shipped_env_file_is_valid_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _systemd_settings(monkeypatch)
    env = _env_file(SYSTEMD / "warmer.env")
    assert all(name.startswith("WARMER_") for name in env)
    assert settings.api.port == int(env["WARMER_API__PORT"])
    assert settings.api.tokens, "a routable bind needs tokens"


def test_stop_timeout_outlasts_the_shutdown_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    service = _unit(SYSTEMD / "warmer.service")["Service"]
    stop_timeout = _timespan_seconds(_last(service, "TimeoutStopSec"))
    assert stop_timeout > _systemd_settings(monkeypatch).reconcile.shutdown_grace_seconds


def test_timespan_parser_reads_systemd_units() -> None:
    assert _timespan_seconds("20") == 20
    assert _timespan_seconds("1min 30s") == 90
    assert _timespan_seconds("500ms") == 0.5
