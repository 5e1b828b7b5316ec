"""deploy/: the Kubernetes manifests and the systemd unit agree with each other and with the real config.

Nothing here is a copy of the manifests' values: ports, paths and timeouts are read from the files and
checked against the settings the daemon would actually load, so editing one file without the other fails.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from warmer.cli import main
from warmer.config.loader import LoadedConfig, load_config
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
SYSTEMD = REPO / "deploy" / "systemd"

# The Deployment takes its secrets from a Secret that is not in the repository (it holds real tokens).
# These are the keys its comment and the README name; the test stands in dummy values for them.
SECRET_ENV = {
    "WARMER_API__TOKENS": '["test-token-not-a-secret"]',
    "WARMER_API__WEBHOOK_SECRET": "test-webhook-secret",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifests' environment only: nothing leaks in from the shell running the tests."""
    for name in list(os.environ):
        if name.startswith("WARMER_"):
            monkeypatch.delenv(name)


# ------------------------------------------------------------------------------------------- Kubernetes


def _manifests() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                documents.append(document)
    return documents


def _one(kind: str) -> dict[str, Any]:
    found = [doc for doc in _manifests() if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/kubernetes, found {len(found)}"
    return found[0]


def _container() -> dict[str, Any]:
    containers = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    warmer = [c for c in containers if c["name"] == "warmer"]
    assert len(warmer) == 1
    return dict(warmer[0])


def _named_port(container: Mapping[str, Any], port: int | str) -> int:
    """A probe's or Service's `port`/`targetPort` (number or port name) as the container's port number."""
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    assert numbers, f"no container port named {port!r}"
    return int(numbers[0])


def _config_path_in_args(args: list[str]) -> PurePosixPath:
    return PurePosixPath(args[args.index("--config") + 1])


def _deployment_env(container: Mapping[str, Any]) -> dict[str, str]:
    """Literal `env` values of the container, plus the dummy secrets its `envFrom` Secret supplies."""
    env = {item["name"]: str(item["value"]) for item in container.get("env", []) if "value" in item}
    secret_refs = [
        source["secretRef"]["name"] for source in container.get("envFrom", []) if "secretRef" in source
    ]
    if secret_refs:
        env.update(SECRET_ENV)
    return env


def _materialize_pod_files(root: Path) -> Path:
    """Write the files the pod sees (ConfigMap keys at their mount paths, empty dirs) under `root`.

    Absolute paths inside the config file are re-rooted at `root`, so the loader finds exactly the files
    the pod would: a profile the ConfigMap does not mount is then a missing file here too.
    Returns the config file named by the container's `--config`.
    """
    deployment = _one("Deployment")
    config_map = _one("ConfigMap")
    pod = deployment["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    container = _container()
    config_file = _config_path_in_args(container["args"])
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        if "configMap" in volume:
            assert volume["configMap"]["name"] == config_map["metadata"]["name"]
            data: Mapping[str, str] = config_map["data"]
            if "subPath" in mount:
                assert mount["subPath"] in data, f"no ConfigMap key {mount['subPath']!r} to mount"
            files = (
                {target: data[mount["subPath"]]}
                if "subPath" in mount
                else {target / key: text for key, text in data.items()}
            )
            for path, text in files.items():
                if PurePosixPath("/" + str(path.relative_to(root))) == config_file:
                    text = text.replace('"/', f'"{root.as_posix()}/')
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        else:
            target.mkdir(parents=True, exist_ok=True)
    return root / str(config_file).lstrip("/")


@pytest.fixture
def pod_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pod's config file on disk, with the environment the Deployment gives the container."""
    for name, value in _deployment_env(_container()).items():
        monkeypatch.setenv(name, value)
    return _materialize_pod_files(tmp_path)


@pytest.fixture
def pod_loaded(pod_config: Path) -> LoadedConfig:
    return load_config(pod_config)


def test_every_manifest_parses_with_kind_and_name() -> None:
    paths = sorted(KUBERNETES.glob("*.yaml"))
    assert paths
    documents = _manifests()
    assert len(documents) >= len(paths)
    for document in documents:
        assert document.get("apiVersion"), document
        assert document.get("kind"), document
        assert document["metadata"]["name"]
    assert {doc["kind"] for doc in documents} >= {"ConfigMap", "Deployment", "Service"}


def test_configmap_config_passes_the_real_validation(pod_loaded: LoadedConfig) -> None:
    assert pod_loaded.boxes, "the example fleet has at least one box"
    assert {box.model for box in pod_loaded.boxes} <= set(pod_loaded.profiles)
    assert not pod_loaded.settings.api.binds_loopback, "a pod must be reachable from the Service"


def test_container_command_checks_out_with_check_config(pod_config: Path) -> None:
    """The container's own args, with `serve` swapped for `check-config`, pass the real CLI."""
    args = list(_container()["args"])
    assert args[-1] == "serve"
    assert args[0] == "--config", "--config is a group option: it comes before the subcommand"
    args[args.index("--config") + 1] = str(pod_config)
    result = CliRunner().invoke(main, [*args[:-1], "check-config"])
    assert result.exit_code == 0, result.output
    assert "config ok" in result.output


def test_the_secret_is_what_makes_the_config_valid(tmp_path: Path) -> None:
    """Without the Secret's tokens the pod's routable bind is refused: the envFrom is load-bearing."""
    container = _container()
    assert any(source.get("secretRef", {}).get("name") for source in container.get("envFrom", []))
    with pytest.raises(ConfigError) as caught:
        load_config(_materialize_pod_files(tmp_path))
    assert "api.tokens" in [path for path, _ in caught.value.problems]


def test_probes_hit_health_endpoints_on_the_api_port(pod_loaded: LoadedConfig) -> None:
    container = _container()
    api_port = pod_loaded.settings.api.port
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/healthz"
    assert readiness["path"] == "/readyz"
    assert _named_port(container, liveness["port"]) == api_port
    assert _named_port(container, readiness["port"]) == api_port
    if "startupProbe" in container:
        startup = container["startupProbe"]["httpGet"]
        assert startup["path"] == "/healthz", "start-up must not wait on /readyz (engines may be cold)"
        assert _named_port(container, startup["port"]) == api_port


def test_service_and_scrape_annotation_target_the_api_port(pod_loaded: LoadedConfig) -> None:
    container = _container()
    api_port = pod_loaded.settings.api.port
    service = _one("Service")
    deployment = _one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for port in service["spec"]["ports"]:
        assert _named_port(container, port.get("targetPort", port["port"])) == api_port
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if "prometheus.io/port" in annotations:
        assert int(annotations["prometheus.io/port"]) == api_port


def test_termination_grace_outlasts_the_shutdown_grace(pod_loaded: LoadedConfig) -> None:
    pod = _one("Deployment")["spec"]["template"]["spec"]
    grace = pod.get("terminationGracePeriodSeconds", 30)  # Kubernetes' default
    assert grace > pod_loaded.settings.reconcile.shutdown_grace_seconds


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
