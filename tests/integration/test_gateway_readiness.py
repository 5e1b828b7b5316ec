"""Done-when: the REAL sglang-router only ever routes to boxes warmer declared ready, shown with a restart.

A real `warmer serve` process with `[fleet.gateway]` pointing at a real sglang-router (PyPI wheel, CPU),
over two real llama-server boxes. Each box runs with its own `--alias`, and llama-server answers every
completion with its alias as `model` (ggml-org/llama.cpp tools/server/README.md, `--alias`: "set an alias
for the model name (to be used by the REST API)"), so which box served a request routed by the router is
the box's own word, not an inference from counters that warm-ups also move.

Checked: no worker before any box is ready; every worker the router lists is a box warmer calls ready;
then exactly the ready boxes, both serving; a restarted box leaves the router, requests during the gap are
all served by the other box, and the restarted box returns only once warmer has it ready again.
Bounded waits only, no timing assertions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testbed.fleet import LlamaFleet, free_loopback_port
from tests.integration.daemon_harness import READY_TIMEOUT_SECONDS, Serve, running_serve, write_config
from tests.integration.router_harness import Router, running_router
from warmer.core.promtext import parse_prometheus_text

pytestmark = pytest.mark.integration

BOX_IDS = ("box-a", "box-b")
LEAVE_TIMEOUT_SECONDS = 60.0
HITRATE_SECTION = "[hitrate]\npoll_seconds = 2.0\nmin_tokens_per_window = 1\n"


@dataclass
class Box:
    """One box: its own one-box fleet (so it can carry its own --alias) and the id warmer knows it by."""

    id: str
    fleet: LlamaFleet

    @property
    def url(self) -> str:
        return self.fleet.boxes[0].base_url

    def restart(self) -> None:
        self.fleet.restart(self.fleet.boxes[0].id)


@pytest.fixture
def boxes(llama_server_binary: Path, tiny_model_path: Path, tmp_path: Path) -> Iterator[dict[str, Box]]:
    """Two llama-server boxes, each answering with its warmer box id as the model alias."""
    started: dict[str, Box] = {}
    try:
        for box_id in BOX_IDS:
            fleet = LlamaFleet(
                1,
                binary=llama_server_binary,
                model=tiny_model_path,
                slots=2,
                ctx_per_slot=4096,
                log_dir=tmp_path / f"llama-{box_id}",
                extra_args=("--alias", box_id),
            )
            started[box_id] = Box(box_id, fleet)
            fleet.start()
        yield started
    finally:
        for box in started.values():
            box.fleet.stop()


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """A real sglang-router with no workers (API and Prometheus URLs). Stopped by PID."""
    with running_router(tmp_path / "sglang-router.log") as started:
        yield started


@pytest.fixture
def daemon(boxes: dict[str, Box], router: Router, tmp_path: Path) -> Iterator[Serve]:
    port = free_loopback_port()
    gateway = f'[fleet.gateway]\nurl = "{router.url}"\napi_style = "workers"\nsync_seconds = 1.0\n'
    fleet = [(box.id, box.url) for box in boxes.values()]
    config = write_config(tmp_path, fleet, port, sections=HITRATE_SECTION, fleet_extra=gateway)
    with running_serve(config, port, tmp_path / "serve.log") as started:
        yield started


def workers(router_url: str) -> set[str]:
    entries = httpx.get(f"{router_url}/workers", timeout=10).json()["workers"]
    return {str(entry["url"]).rstrip("/") for entry in entries}


def served_by(router_url: str, prompt: str) -> str:
    """Send a completion through the router; the serving box names itself (its alias) as `model`."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    response = httpx.post(f"{router_url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    model = response.json()["model"]
    assert isinstance(model, str)
    return model


def test_router_only_ever_routes_to_boxes_warmer_declared_ready(
    boxes: dict[str, Box],
    router: Router,
    daemon: Serve,
) -> None:
    router_url, router_metrics = router.url, router.metrics_url
    base_url = daemon.base_url
    url_of = {box.id: box.url for box in boxes.values()}
    id_of = {url: box_id for box_id, url in url_of.items()}
    box_a, box_b = boxes["box-a"], boxes["box-b"]

    empty_before_ready: list[bool] = []

    def listed_only_ready() -> bool:
        """Invariant, checked on every poll: the router lists a box only if warmer calls it ready.
        The list is read first: a box is added only once ready, so it must still be ready after."""
        listed = workers(router_url)
        assert listed <= set(id_of), f"the router lists workers warmer never added: {listed}"
        for url in listed:
            assert daemon.is_ready(id_of[url]), f"router lists {id_of[url]} but warmer says it is not ready"
        if not listed and not any(daemon.is_ready(box_id) for box_id in BOX_IDS):
            empty_before_ready.append(True)
        return listed == set(id_of)

    # Start-up: no worker until a box is ready, then exactly the ready boxes.
    daemon.wait("the daemon API", lambda: httpx.get(f"{base_url}/healthz").status_code == 200, 120)
    assert workers(router_url) <= {url for box_id, url in url_of.items() if daemon.is_ready(box_id)}
    daemon.wait("both boxes registered", listed_only_ready, READY_TIMEOUT_SECONDS)
    assert empty_before_ready, "never saw the router empty while no box was ready"
    assert all(daemon.is_ready(box_id) for box_id in BOX_IDS)

    # Completions through the router are served by the ready boxes (round robin: both of them).
    served = {served_by(router_url, f"Call {i}: hello, who is this?") for i in range(4)}
    assert served == set(BOX_IDS)

    # Restart box-b: it leaves the router...
    box_b.restart()
    daemon.wait(
        "the restarted box to leave the router",
        lambda: url_of["box-b"] not in workers(router_url),
        LEAVE_TIMEOUT_SECONDS,
    )

    # ...requests in the gap all land on box-a, and box-b comes back only once warmer has it ready again.
    during_gap: list[str] = []

    def back_and_ready() -> bool:
        listed = workers(router_url)
        if url_of["box-b"] in listed:
            assert daemon.is_ready("box-b"), "box-b is a worker again before warmer declared it ready"
            return True
        server = served_by(router_url, f"Gap call {len(during_gap)}: are you there?")
        if server == "box-b":
            # only legitimate if box-b was re-added (ready) between the list and the request
            assert url_of["box-b"] in workers(router_url), "a gap request landed on the restarting box"
            assert daemon.is_ready("box-b")
            return True
        during_gap.append(server)
        return False

    daemon.wait("box-b back in the router", back_and_ready, READY_TIMEOUT_SECONDS)
    assert during_gap, "no request was sent while box-b was out"
    assert set(during_gap) == {"box-a"}, during_gap
    assert box_a.url in workers(router_url)

    # Back to both boxes.
    served = {served_by(router_url, f"After {i}: hello again") for i in range(4)}
    assert served == set(BOX_IDS)

    # The router's own per-worker record agrees: both workers served successfully.
    samples = parse_prometheus_text(httpx.get(router_metrics, timeout=10).text)
    successes = {
        dict(s.labels).get("worker", "").rstrip("/"): s.value
        for s in samples
        if s.name == "smg_worker_cb_outcomes_total" and dict(s.labels).get("outcome") == "success"
    }
    assert successes.get(url_of["box-a"], 0) > 0
    assert successes.get(url_of["box-b"], 0) > 0

    # warmer counted what it did to the router.
    metrics = parse_prometheus_text(httpx.get(f"{base_url}/metrics", timeout=10).text)
    changes = {
        (dict(s.labels)["action"], dict(s.labels)["outcome"]): s.value
        for s in metrics
        if s.name == "warmer_gateway_worker_changes_total"
    }
    assert changes[("register", "ok")] >= 3  # a, b, and b again
    assert changes[("deregister", "ok")] >= 1

    daemon.stop()
