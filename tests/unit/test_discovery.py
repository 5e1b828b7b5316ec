"""Fleet discovery on Kubernetes: the pod lister against a fake API server at the HTTP client seam, and the
discovery loop against a fake fleet (adds, removals, replacements, outages that change nothing)."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from warmer.adapters.discovery import KubernetesPods, PodTemplate
from warmer.config.loader import load_config
from warmer.config.profiles import load_profile_set
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError, DiscoveryUnavailable
from warmer.core.model import BoxSpec, EngineKind
from warmer.root.app import build
from warmer.root.metrics import Metrics
from warmer.service.discovery import FleetDiscovery

TEMPLATE = PodTemplate(engine=EngineKind.SGLANG, model="dense-sglang", port=30000, slots=48, group="gpu")


def pod(name: str, ip: str | None, *, phase: str = "Running", terminating: bool = False) -> dict[str, Any]:
    """A Pod as the API lists it (k8s.io/api core/v1: metadata.name/deletionTimestamp, status.phase/podIP);
    the Ready condition is false: an engine pod is warmed before its readiness probe passes."""
    metadata: dict[str, Any] = {"name": name, "namespace": "inference", "labels": {"app": "sglang"}}
    if terminating:
        metadata["deletionTimestamp"] = "2026-12-01T09:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": "False"}]}
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": metadata, "spec": {"containers": [{"name": "sglang"}]}, "status": status}


class FakeApiServer:
    """GET /api/v1/namespaces/{ns}/pods with a labelSelector, as the Kubernetes API serves a PodList."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.requests: list[httpx.Request] = []
        self.status = 200

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status != 200:
            body = {
                "kind": "Status",
                "status": "Failure",
                "message": "pods is forbidden",
                "code": self.status,
            }
            return httpx.Response(self.status, json=body)
        assert request.url.path == "/api/v1/namespaces/inference/pods"
        selector = request.url.params["labelSelector"]
        assert selector == "app=sglang"
        return httpx.Response(200, json={"kind": "PodList", "apiVersion": "v1", "items": self.pods})


SA_TOKEN = "sa-token"


def lister(server: FakeApiServer, token: str | None = SA_TOKEN) -> tuple[KubernetesPods, httpx.AsyncClient]:
    http = httpx.AsyncClient(transport=httpx.MockTransport(server.handle))
    pods = KubernetesPods(
        http,
        api_url="https://kubernetes.default.svc",
        namespace="inference",
        label_selector="app=sglang",
        template=TEMPLATE,
        token=lambda: token,
    )
    return pods, http


def test_running_pods_with_an_address_become_boxes_ready_or_not() -> None:
    server = FakeApiServer(
        [
            pod("sglang-1", "10.1.0.8"),
            pod("sglang-0", "10.1.0.7"),
            pod("sglang-2", None, phase="Pending"),
            pod("sglang-3", "10.1.0.9", terminating=True),
            pod("sglang-4", "10.1.0.10", phase="Succeeded"),
            pod("sglang-v6", "fd00::12"),
        ]
    )

    async def scenario() -> list[BoxSpec]:
        pods, http = lister(server)
        async with http:
            return await pods.list_boxes()

    boxes = asyncio.run(scenario())
    assert [(b.id, b.base_url) for b in boxes] == [
        ("sglang-0", "http://10.1.0.7:30000"),
        ("sglang-1", "http://10.1.0.8:30000"),
        ("sglang-v6", "http://[fd00::12]:30000"),
    ]
    assert {(b.engine, b.model, b.slots, b.group) for b in boxes} == {
        (EngineKind.SGLANG, "dense-sglang", 48, "gpu")
    }
    assert server.requests[0].headers["Authorization"] == "Bearer sa-token"


def test_an_api_refusal_or_a_non_podlist_is_a_discovery_error_naming_it() -> None:
    server = FakeApiServer([])
    server.status = 403

    async def scenario() -> None:
        pods, http = lister(server)
        async with http:
            with pytest.raises(DiscoveryUnavailable, match="403: pods is forbidden"):
                await pods.list_boxes()

    asyncio.run(scenario())

    async def not_a_list() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200, text="<html>")))
        pods = KubernetesPods(
            http,
            api_url="http://api",
            namespace="n",
            label_selector="a=b",
            template=TEMPLATE,
            token=lambda: None,
        )
        async with http:
            with pytest.raises(DiscoveryUnavailable, match="without a PodList"):
                await pods.list_boxes()

    asyncio.run(not_a_list())


class FakeSource:
    def __init__(self) -> None:
        self.boxes: list[BoxSpec] = []
        self.error: DiscoveryUnavailable | None = None

    async def list_boxes(self) -> Sequence[BoxSpec]:
        if self.error is not None:
            raise self.error
        return list(self.boxes)


class FakeFleet:
    """The reconciler's fleet editing surface: refuses a duplicate id or an unknown model as it does."""

    def __init__(self, *configured: BoxSpec) -> None:
        self.boxes = {box.id: box for box in configured}
        self.log: list[tuple[str, str]] = []

    def fleet(self) -> Mapping[str, BoxSpec]:
        return dict(self.boxes)

    async def add_box(self, box: BoxSpec) -> None:
        if box.model != "dense-sglang":
            raise ConfigError([("box.model", f"unknown model profile {box.model!r}")])
        self.boxes[box.id] = box
        self.log.append(("add", box.id))

    async def remove_box(self, box_id: str) -> None:
        del self.boxes[box_id]
        self.log.append(("remove", box_id))


class Clock:
    def now(self) -> float:
        return 0.0

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)


def box(box_id: str, ip: str, model: str = "dense-sglang") -> BoxSpec:
    return BoxSpec(id=box_id, base_url=f"http://{ip}:30000", engine=EngineKind.SGLANG, model=model)


def test_discovery_adds_removes_and_replaces_only_its_own_boxes() -> None:
    configured = box("static-0", "10.9.0.1")
    fleet, source = FakeFleet(configured), FakeSource()
    changes: list[list[str]] = []
    discovery = FleetDiscovery(
        source=source,
        fleet=fleet,
        clock=Clock(),
        interval_seconds=5,
        on_fleet_change=lambda boxes: changes.append(sorted(b.id for b in boxes)),
    )

    async def scenario() -> None:
        source.boxes = [
            box("sglang-0", "10.1.0.7"),
            box("sglang-1", "10.1.0.8"),
            box("static-0", "10.1.0.99"),
        ]
        first = await discovery.sync_once()
        assert (first.added, first.skipped) == (("sglang-0", "sglang-1"), ("static-0",))
        assert fleet.boxes["static-0"] == configured, "a configured box is never replaced"

        source.error = DiscoveryUnavailable("Kubernetes API unreachable")
        outage = await discovery.sync_once()
        assert outage.error is not None
        assert set(fleet.boxes) == {"static-0", "sglang-0", "sglang-1"}, "an outage empties nothing"

        source.error = None
        source.boxes = [
            box("sglang-1", "10.1.0.18"),
            box("sglang-2", "10.1.0.9"),
            box("other", "10.1.0.5", "x"),
        ]
        second = await discovery.sync_once()
        assert second.removed == ("sglang-0", "sglang-1")
        assert second.added == ("sglang-1", "sglang-2")
        assert second.skipped == ("other",)  # the reconciler refused it (unknown model): logged, not fatal
        assert fleet.boxes["sglang-1"].base_url == "http://10.1.0.18:30000"

        source.boxes = []
        await discovery.sync_once()
        assert set(fleet.boxes) == {"static-0"}

    asyncio.run(scenario())
    assert changes == [
        ["sglang-0", "sglang-1", "static-0"],
        ["sglang-1", "sglang-2", "static-0"],
        ["static-0"],
    ]


def test_a_restarted_daemon_finds_its_discovered_boxes_again() -> None:
    """Runtime fleet changes are not in the config: a new daemon's first listing restores them."""
    source = FakeSource()
    source.boxes = [box("sglang-0", "10.1.0.7")]

    async def daemon_lifetime() -> set[str]:
        fleet = FakeFleet()
        await FleetDiscovery(source=source, fleet=fleet, clock=Clock(), interval_seconds=5).sync_once()
        return set(fleet.boxes)

    assert asyncio.run(daemon_lifetime()) == {"sglang-0"}
    assert asyncio.run(daemon_lifetime()) == {"sglang-0"}


def test_each_listing_is_counted_by_outcome_with_the_boxes_it_keeps() -> None:
    """The discovery metric the WarmerDiscoveryFailing alert reads: ok/failed listings, and the count."""
    fleet, source = FakeFleet(), FakeSource()
    metrics = Metrics()
    discovery = FleetDiscovery(
        source=source, fleet=fleet, clock=Clock(), interval_seconds=5, observer=metrics.discovery
    )

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("warmer_discovery_listings_total", outcome="failed") == 0, "exists before any listing"

    async def scenario() -> None:
        source.boxes = [box("sglang-0", "10.1.0.7"), box("sglang-1", "10.1.0.8")]
        await discovery.sync_once()
        source.error = DiscoveryUnavailable("Kubernetes API answered 403: pods is forbidden")
        await discovery.sync_once()
        await discovery.sync_once()

    asyncio.run(scenario())
    assert value("warmer_discovery_listings_total", outcome="ok") == 1
    assert value("warmer_discovery_listings_total", outcome="failed") == 2
    assert value("warmer_discovery_boxes") == 2, "an outage keeps the last count, as it keeps the boxes"


def test_the_loop_lists_until_stopped() -> None:
    fleet, source = FakeFleet(), FakeSource()
    source.boxes = [box("sglang-0", "10.1.0.7")]
    discovery = FleetDiscovery(source=source, fleet=fleet, clock=Clock(), interval_seconds=5)

    async def scenario() -> None:
        stopping = asyncio.Event()
        task = asyncio.create_task(discovery.run(stopping))
        for _ in range(50):
            await asyncio.sleep(0)
        stopping.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    assert fleet.log == [("add", "sglang-0")]


def _config(tmp_path: Path, discovery: str) -> Path:
    path = tmp_path / "warmer.toml"
    path.write_text(f"[fleet.discovery]\n{discovery}\n")
    return path


def test_discovery_settings_load_and_bad_ones_name_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("WARMER_")]:
        monkeypatch.delenv(name)
    good = "\n".join(
        ['namespace = "inference"', 'label_selector = "app=sglang"', "port = 30000", 'engine = "sglang"']
    )
    good += '\nmodel = "dense-sglang"'
    loaded = load_config(_config(tmp_path, good))
    discovery = loaded.settings.fleet.discovery
    assert discovery is not None
    assert (discovery.namespace, discovery.port, discovery.interval_seconds) == ("inference", 30000, 15.0)
    bad = good.replace('model = "dense-sglang"', 'model = "dense-vllm"').replace("port = 30000", "port = 0")
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, bad))
    assert [path for path, _ in caught.value.problems] == ["fleet.discovery.port"]
    wrong_engine = good.replace('model = "dense-sglang"', 'model = "dense-vllm"')
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, wrong_engine))
    assert [path for path, _ in caught.value.problems] == ["fleet.discovery.engine"]
    assert json.dumps(discovery.model_dump(mode="json"))  # the settings tree serialises (status, logs)


class _PodListHandler(http.server.BaseHTTPRequestHandler):
    """A stand-in Kubernetes API server over real HTTP: one PodList for any pods listing."""

    pods: ClassVar[list[dict[str, Any]]] = []

    def do_GET(self) -> None:
        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": self.pods}).encode()
        self.send_response(200 if self.path.startswith("/api/v1/namespaces/inference/pods?") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_a_daemon_with_only_discovery_runs_and_lists_the_discovered_pod(tmp_path: Path) -> None:
    """No configured boxes: the reconciler still runs, and the pod the API lists shows in /v1/boxes."""
    _PodListHandler.pods = [pod("sglang-0", "127.0.0.1")]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PodListHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(
        api={"host": "127.0.0.1", "port": port},
        database={"state_dir": str(tmp_path)},
        reconcile={"shutdown_grace_seconds": 5},
        fleet={
            "discovery": {
                "namespace": "inference",
                "label_selector": "app=sglang",
                "port": 30000,
                "engine": "sglang",
                "model": "dense-sglang",
                "api_url": f"http://127.0.0.1:{server.server_address[1]}",
                "token_file": str(tmp_path / "no-token"),
                "ca_file": None,
            }
        },
    )
    daemon = build(settings, profiles=load_profile_set())

    async def scenario() -> list[str]:
        running = asyncio.create_task(daemon.run(handle_signals=False))
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                for _ in range(200):
                    try:
                        answer = await client.get("/v1/boxes")
                        if answer.status_code == 200 and answer.json()["boxes"]:
                            assert {"reconciler", "discovery"} <= set(daemon.supervisor.task_names)
                            return [b["id"] for b in answer.json()["boxes"]]
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.05)
            raise AssertionError("the discovered pod never showed in /v1/boxes")
        finally:
            daemon.supervisor.request_stop("test over")
            assert await asyncio.wait_for(running, 30) == 0

    try:
        assert asyncio.run(scenario()) == ["sglang-0"]
    finally:
        server.shutdown()
        server.server_close()
