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

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testbed.fleet import LlamaFleet, free_loopback_port, log_tail
from warmer.core.promtext import parse_prometheus_text

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO / "config" / "agents"
MODELS_DIR = REPO / "models"
AGENT = "outbound-sales"
BOX_IDS = ("box-a", "box-b")
READY_TIMEOUT_SECONDS = 240.0  # bounds for a loaded 2-core machine, not expectations
LEAVE_TIMEOUT_SECONDS = 60.0


def warmer_script() -> str:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    assert script is not None, "the `warmer` console script is installed next to the interpreter"
    return script


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
def router(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real sglang-router with no workers: (API URL, its Prometheus URL). Stopped by PID."""
    port, metrics_port = free_loopback_port(), free_loopback_port()
    log_path = tmp_path / "sglang-router.log"
    command = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--policy", "round_robin",
        "--health-check-interval-secs", "1",
        "--log-level", "warn",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {proc.returncode}:\n{log_tail(log_path)}")
            try:
                if httpx.get(f"{url}/workers", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router did not answer /workers:\n{log_tail(log_path)}")
            time.sleep(0.2)
        yield url, f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_config(tmp_path: Path, boxes: dict[str, Box], router_url: str, port: int) -> Path:
    agents = tmp_path / "agents"
    agents.mkdir()
    shutil.copy(AGENTS_DIR / f"{AGENT}.toml", agents)
    shutil.copy(AGENTS_DIR / f"{AGENT}.tools.json", agents)
    shutil.copytree(AGENTS_DIR / AGENT, agents / AGENT)
    fleet = "\n".join(
        f'[[fleet.boxes]]\nid = "{box.id}"\nbase_url = "{box.url}"\nengine = "llamacpp"\n'
        f'model = "tiny-demo"\nslots = 2\n'
        for box in boxes.values()
    )
    config = tmp_path / "warmer.toml"
    config.write_text(
        f"""
[database]
state_dir = "{tmp_path / "state"}"

[api]
host = "127.0.0.1"
port = {port}

[reconcile]
interval_seconds = 0.5
health_poll_seconds = 0.5
ramp_seconds = 2.0
shutdown_grace_seconds = 5.0

[hitrate]
poll_seconds = 2.0
min_tokens_per_window = 1

[logging]
format = "json"

[fleet]
models_dir = "{MODELS_DIR}"
agents_dir = "{agents}"

[fleet.gateway]
url = "{router_url}"
api_style = "workers"
sync_seconds = 1.0

{fleet}
"""
    )
    return config


@pytest.fixture
def daemon(
    boxes: dict[str, Box], router: tuple[str, str], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    port = free_loopback_port()
    config = write_config(tmp_path, boxes, router[0], port)
    log_path = tmp_path / "serve.log"
    env = {key: value for key, value in os.environ.items() if not key.startswith("WARMER_")}
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [warmer_script(), "--config", str(config), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    try:
        yield process, f"http://127.0.0.1:{port}", log_path
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def wait_until(
    what: str, check: Callable[[], bool], process: subprocess.Popen[str], log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"serve exited with {process.returncode}:\n{log.read_text()[-5000:]}"
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-5000:]}")


def workers(router_url: str) -> set[str]:
    entries = httpx.get(f"{router_url}/workers", timeout=10).json()["workers"]
    return {str(entry["url"]).rstrip("/") for entry in entries}


def ready(base_url: str, box_id: str) -> bool:
    return httpx.get(f"{base_url}/v1/boxes/{box_id}/ready", timeout=10).status_code == 200


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
    router: tuple[str, str],
    daemon: tuple[subprocess.Popen[str], str, Path],
) -> None:
    router_url, router_metrics = router
    process, base_url, log = daemon
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
            assert ready(base_url, id_of[url]), f"router lists {id_of[url]} but warmer says it is not ready"
        if not listed and not any(ready(base_url, box_id) for box_id in BOX_IDS):
            empty_before_ready.append(True)
        return listed == set(id_of)

    # Start-up: no worker until a box is ready, then exactly the ready boxes.
    wait_until(
        "the daemon API", lambda: httpx.get(f"{base_url}/healthz").status_code == 200, process, log, 120
    )
    assert workers(router_url) <= {url for box_id, url in url_of.items() if ready(base_url, box_id)}
    wait_until("both boxes registered", listed_only_ready, process, log, READY_TIMEOUT_SECONDS)
    assert empty_before_ready, "never saw the router empty while no box was ready"
    assert all(ready(base_url, box_id) for box_id in BOX_IDS)

    # Completions through the router are served by the ready boxes (round robin: both of them).
    served = {served_by(router_url, f"Call {i}: hello, who is this?") for i in range(4)}
    assert served == set(BOX_IDS)

    # Restart box-b: it leaves the router...
    box_b.restart()
    wait_until(
        "the restarted box to leave the router",
        lambda: url_of["box-b"] not in workers(router_url),
        process, log, LEAVE_TIMEOUT_SECONDS,
    )  # fmt: skip

    # ...requests in the gap all land on box-a, and box-b comes back only once warmer has it ready again.
    during_gap: list[str] = []

    def back_and_ready() -> bool:
        listed = workers(router_url)
        if url_of["box-b"] in listed:
            assert ready(base_url, "box-b"), "box-b is a worker again before warmer declared it ready"
            return True
        server = served_by(router_url, f"Gap call {len(during_gap)}: are you there?")
        if server == "box-b":
            # only legitimate if box-b was re-added (ready) between the list and the request
            assert url_of["box-b"] in workers(router_url), "a gap request landed on the restarting box"
            assert ready(base_url, "box-b")
            return True
        during_gap.append(server)
        return False

    wait_until("box-b back in the router", back_and_ready, process, log, READY_TIMEOUT_SECONDS)
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

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log.read_text()[-5000:]
