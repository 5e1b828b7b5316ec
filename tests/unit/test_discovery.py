"""Fleet discovery on Kubernetes: the pod source (lightkube) against a fake API server on loopback that
speaks LIST and WATCH (tests/unit/fake_kube_api.py), and the discovery loop against a fake fleet (adds,
removals, replacements, an expired watch, outages that change nothing, backoff)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.fake_kube_api import FakeKubeApi
from warmer.adapters.discovery import KubernetesPods, PodTemplate, api_client
from warmer.config.loader import load_config
from warmer.config.profiles import load_profile_set
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError, DiscoveryUnavailable
from warmer.core.label_selector import Requirement, parse_label_selector
from warmer.core.model import BoxSpec, EngineKind
from warmer.root.app import build
from warmer.root.metrics import Metrics
from warmer.service.fleet.discovery import FleetDiscovery

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


SA_TOKEN = "sa-token"


def pods_of(api: FakeKubeApi, tmp_path: Path, selector: str = "app=sglang") -> KubernetesPods:
    token = tmp_path / "token"
    token.write_text(SA_TOKEN)
    client = api_client(api.url, token_file=token, ca_file=None, namespace="inference")
    return KubernetesPods(client, namespace="inference", label_selector=selector, template=TEMPLATE)


def test_running_pods_with_an_address_become_boxes_ready_or_not(tmp_path: Path) -> None:
    api = FakeKubeApi()
    for item in (
        pod("sglang-1", "10.1.0.8"),
        pod("sglang-0", "10.1.0.7"),
        pod("sglang-2", None, phase="Pending"),
        pod("sglang-3", "10.1.0.9", terminating=True),
        pod("sglang-4", "10.1.0.10", phase="Succeeded"),
        pod("sglang-v6", "fd00::12"),
    ):
        api.put(item, announce=False)

    async def scenario() -> list[BoxSpec]:
        async with api.serving():
            return await pods_of(api, tmp_path, "app=sglang,tier in (gpu, big),!canary").list_boxes()

    boxes = asyncio.run(scenario())
    assert [(b.id, b.base_url) for b in boxes] == [
        ("sglang-0", "http://10.1.0.7:30000"),
        ("sglang-1", "http://10.1.0.8:30000"),
        ("sglang-v6", "http://[fd00::12]:30000"),
    ]
    assert {(b.engine, b.model, b.slots, b.group) for b in boxes} == {
        (EngineKind.SGLANG, "dense-sglang", 48, "gpu")
    }
    ((kind, query),) = api.requests
    assert kind == "list"
    assert query["labelSelector"] == "app=sglang,tier in (big,gpu),!canary"
    assert api.authorizations == [f"Bearer {SA_TOKEN}"], "the service-account token, read from its file"


def test_an_api_refusal_is_a_discovery_error_naming_it(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.refuse = 403

    async def scenario() -> None:
        async with api.serving():
            with pytest.raises(DiscoveryUnavailable, match="list answered 403: pods is forbidden"):
                await pods_of(api, tmp_path).list_boxes()
            watch = pods_of(api, tmp_path).watch_boxes()
            with pytest.raises(DiscoveryUnavailable, match="403"):
                await anext(watch)

    asyncio.run(scenario())


async def _next(watch: AsyncIterator[Sequence[BoxSpec]]) -> list[str]:
    return [box.id for box in await anext(watch)]


def test_the_watch_follows_adds_changes_and_deletes_and_lists_again_when_the_watch_expires(
    tmp_path: Path,
) -> None:
    """LIST, then WATCH from the list's resourceVersion; a 410 Gone (compacted) means the deletes made
    meanwhile were never sent: the source lists again instead of watching on."""
    api = FakeKubeApi()
    api.put(pod("sglang-0", "10.1.0.7"), announce=False)
    api.put(pod("sglang-1", None, phase="Pending"), announce=False)

    async def scenario() -> list[list[str]]:
        seen = []
        async with api.serving():
            watch = pods_of(api, tmp_path).watch_boxes()
            seen.append(await _next(watch))  # the listing
            listed_at = api.version
            waiting = asyncio.ensure_future(_next(watch))
            await api.wait_watching()
            api.put(pod("sglang-1", "10.1.0.8"))  # scheduled and running: MODIFIED
            seen.append(await waiting)
            api.put(pod("sglang-1", "10.1.0.8"))  # a change that changes no box: nothing new
            api.delete("sglang-0")
            seen.append(await _next(watch))
            api.delete("sglang-1", announce=False)  # gone while the server compacted its history
            api.put(pod("sglang-2", "10.1.0.9"), announce=False)
            api.expire_watches()
            seen.append(await _next(watch))  # listed again
            await watch.aclose()
        watches = [query for kind, query in api.requests if kind == "watch"]
        assert watches[0]["resourceVersion"] == str(listed_at), "the watch starts where the listing ended"
        assert [kind for kind, _ in api.requests].count("list") == 2
        return seen

    assert asyncio.run(scenario()) == [["sglang-0"], ["sglang-0", "sglang-1"], ["sglang-1"], ["sglang-2"]]


def test_label_selectors_are_read_as_kubernetes_reads_them() -> None:
    assert parse_label_selector("app=sglang, tier in (gpu,big),!canary,zone, env!=dev,x==y") == (
        Requirement("app", "=", ("sglang",)),
        Requirement("tier", "in", ("gpu", "big")),
        Requirement("canary", "!exists"),
        Requirement("zone", "exists"),
        Requirement("env", "!=", ("dev",)),
        Requirement("x", "=", ("y",)),
    )
    for bad in ("", "app=sglang,,", "app in gpu", "=x", "app=sglang,app=vllm"):
        with pytest.raises(ValueError, match="label selector"):
            parse_label_selector(bad)


class FakeSource:
    def __init__(self) -> None:
        self.boxes: list[BoxSpec] = []
        self.error: DiscoveryUnavailable | None = None

    async def list_boxes(self) -> Sequence[BoxSpec]:
        if self.error is not None:
            raise self.error
        return list(self.boxes)

    async def watch_boxes(self) -> AsyncIterator[Sequence[BoxSpec]]:
        yield await self.list_boxes()


class FakeFleet:
    """The reconciler's fleet editing surface: refuses a duplicate id or an unknown model as it does."""

    def __init__(self, *configured: BoxSpec) -> None:
        self.boxes = {box.id: box for box in configured}
        self.log: list[tuple[str, str]] = []
        self.added = asyncio.Event()  # set at each add

    def fleet(self) -> Mapping[str, BoxSpec]:
        return dict(self.boxes)

    async def add_box(self, box: BoxSpec) -> None:
        if box.model != "dense-sglang":
            raise ConfigError([("box.model", f"unknown model profile {box.model!r}")])
        self.boxes[box.id] = box
        self.log.append(("add", box.id))
        self.added.set()

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
    bad_selector = good.replace('label_selector = "app=sglang"', 'label_selector = "app in sglang"')
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, bad_selector))
    assert [path for path, _ in caught.value.problems] == ["fleet.discovery.label_selector"]
    assert json.dumps(discovery.model_dump(mode="json"))  # the settings tree serialises (status, logs)


def test_a_daemon_with_only_discovery_runs_and_lists_the_discovered_pod(tmp_path: Path) -> None:
    """No configured boxes: the reconciler still runs, and the pod the API lists shows in /v1/boxes."""
    api = FakeKubeApi()
    api.put(pod("sglang-0", "127.0.0.1"), announce=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def scenario() -> list[str]:
        async with api.serving():
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
                        "api_url": api.url,
                        "token_file": str(tmp_path / "no-token"),
                        "ca_file": None,
                    }
                },
            )
            daemon = build(settings, profiles=load_profile_set())
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

    assert asyncio.run(scenario()) == ["sglang-0"]


class BackoffClock(Clock):
    """Records each backoff wait; after `failures` of them, lets the API answer again."""

    def __init__(self, api: FakeKubeApi, failures: int) -> None:
        self.api, self.failures, self.waits = api, failures, []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if len(self.waits) == self.failures:
            self.api.refuse = None
        await asyncio.sleep(0)


def test_an_api_outage_backs_off_doubling_then_the_watch_resumes_from_a_listing(tmp_path: Path) -> None:
    api = FakeKubeApi()
    api.put(pod("sglang-0", "10.1.0.7"), announce=False)
    api.refuse = 403  # the Role is not there yet
    fleet = FakeFleet()
    metrics = Metrics()
    clock = BackoffClock(api, failures=5)

    async def scenario() -> None:
        async with api.serving():
            discovery = FleetDiscovery(
                source=pods_of(api, tmp_path),
                fleet=fleet,
                clock=clock,
                interval_seconds=5,
                observer=metrics.discovery,
            )
            stopping = asyncio.Event()
            running = asyncio.ensure_future(discovery.run(stopping))
            await api.wait_watching()  # listed, and watching
            api.put(pod("sglang-1", "10.1.0.8"))
            while "sglang-1" not in fleet.boxes:
                fleet.added.clear()
                await fleet.added.wait()
            stopping.set()
            await asyncio.wait_for(running, 10)

    asyncio.run(scenario())
    assert clock.waits == [1, 2, 4, 5, 5], "1 s doubling, capped at interval_seconds"
    assert set(fleet.boxes) == {"sglang-0", "sglang-1"}
    failed = metrics.registry.get_sample_value("warmer_discovery_listings_total", {"outcome": "failed"})
    assert failed == 5
    assert metrics.registry.get_sample_value("warmer_discovery_boxes") == 2
