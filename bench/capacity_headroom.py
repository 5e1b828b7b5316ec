"""Capacity for pacing: does `GET /v1/capacity` headroom reach 0 before time to first token breaks?

Starts one real llama-server box of the tiny test model (testbed, `--parallel 2`, 4k tokens per slot) and a
real `warmer serve` over it (the integration harness's config and process handling). The restart warm-up's
long prefill measures the box's prefill ceiling; then uncached prefill load is offered in steps, as a share
of that measured ceiling in tokens/s: full fresh prompts (a new first character each, `cache_prompt`
false) with one output token, sent open-loop at a fixed spacing so a box that cannot keep up queues them.
Fixed-size fresh probe requests run through every step; their offered tokens count towards the step's
load, so the 0% step is the probes alone.

Per step: the agent's headroom as `GET /v1/capacity` reports it (mean over the step's samples, tokens/s and
as a share of the ceiling), the uncached tokens/s the engine reported computing (`timings.prompt_n` of the
requests that finished in the step, over the step), the same figure from the daemon's counter windows
(`used_tokens_per_second`), the box's own headroom and how many samples found the agent with no routed
box (then the agent's headroom is unknown: `/v1/capacity` sums over routed boxes only),
and the probes' client-side time to first token (one output token, so the
whole request) p50/p90 as a ratio against the 0% step of the same run.

    .venv/bin/python -m bench.capacity_headroom [--quick] [--steps 0,20,40,60,80,100,120]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_figures import percentile
from testbed.fleet import LlamaFleet, free_loopback_port
from testbed.llama_build import ensure_llama_server
from testbed.tiny_model import ensure_tiny_model
from tests.integration.daemon_harness import (
    AGENT,
    CAPACITY_POLL_SECONDS,
    CAPACITY_SECTIONS,
    fleet_boxes,
    fresh_prompt,
    running_serve,
    write_config,
)

DEFAULT_STEPS = (0, 20, 40, 60, 80, 100, 120, 160, 200, 300)
MAX_IN_FLIGHT = 24  # open-loop load beyond this is dropped (counted), so an overloaded step stays bounded
BREAK_RATIO = 1.5  # TTFT p50 at this multiple of idle counts as "latency climbs"


@dataclass(frozen=True, slots=True)
class StepFigures:
    """What one load step measured."""

    load_percent: int  # offered uncached tokens/s as % of the measured ceiling (probes included)
    offered_tokens_per_second: float
    engine_tokens_per_second: float  # timings.prompt_n of requests finished in the step / step seconds
    counter_tokens_per_second: float | None  # the daemon's counter windows (`used_tokens_per_second`), mean
    headroom_tokens_per_second: float | None  # `GET /v1/capacity`, the agent's, mean over the step
    headroom_fraction: float | None  # of the ceiling
    box_headroom_tokens_per_second: float | None  # the box's own entry, mean (known while it is unrouted)
    unrouted_samples: int  # capacity samples where the agent had no routed box (the box not ready)
    samples: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    ttft_p50_ratio: float  # against the 0% step
    ttft_p90_ratio: float
    probes: int
    dropped: int  # load requests not sent because MAX_IN_FLIGHT were outstanding


@dataclass(frozen=True, slots=True)
class Crossings:
    """From which load step on headroom stays <= 0, and TTFT p50 / p90 stay >= `BREAK_RATIO` x idle."""

    headroom_zero_percent: int | None
    ttft_p50_break_percent: int | None
    ttft_p90_break_percent: int | None


def crossings(steps: Sequence[StepFigures], break_ratio: float = BREAK_RATIO) -> Crossings:
    """The lowest step from which every higher step holds too, so one noisy step (the machine is shared)
    neither starts nor ends a break; None where the last step does not hold."""
    ordered = sorted(steps, key=lambda s: s.load_percent)

    def sustained(hit: list[bool]) -> int | None:
        start = None
        for step, held in zip(ordered, hit, strict=True):
            if not held:
                start = None
            elif start is None:
                start = step.load_percent
        return start

    return Crossings(
        headroom_zero_percent=sustained(
            [s.headroom_tokens_per_second is not None and s.headroom_tokens_per_second <= 0 for s in ordered]
        ),
        ttft_p50_break_percent=sustained([s.ttft_p50_ratio >= break_ratio for s in ordered]),
        ttft_p90_break_percent=sustained([s.ttft_p90_ratio >= break_ratio for s in ordered]),
    )


def markdown_table(steps: Sequence[StepFigures]) -> str:
    lines = [
        "| load (% of ceiling) | offered tok/s | engine tok/s | counter tok/s | headroom tok/s "
        "| headroom / ceiling | box headroom tok/s | agent unrouted | TTFT p50 | TTFT p90 | p50 vs idle "
        "| p90 vs idle | probes | dropped |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def opt(value: float | None, fmt: str) -> str:
        return "–" if value is None else format(value, fmt)

    for s in sorted(steps, key=lambda s: s.load_percent):
        lines.append(
            f"| {s.load_percent}% | {s.offered_tokens_per_second:.0f} | {s.engine_tokens_per_second:.0f} "
            f"| {opt(s.counter_tokens_per_second, '.0f')} | {opt(s.headroom_tokens_per_second, '.0f')} "
            f"| {opt(s.headroom_fraction, '.2f')} | {opt(s.box_headroom_tokens_per_second, '.0f')} "
            f"| {s.unrouted_samples}/{s.samples} | {s.ttft_p50_ms:.0f} ms | {s.ttft_p90_ms:.0f} ms "
            f"| {s.ttft_p50_ratio:.2f}x | {s.ttft_p90_ratio:.2f}x | {s.probes} | {s.dropped} |"
        )
    return "\n".join(lines)


@dataclass
class _Step:
    computed_tokens: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    capacity: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0


async def _complete(client: httpx.AsyncClient, box_url: str, chars: int) -> tuple[float, int]:
    """(client-side ms, engine-computed prompt tokens) of one fresh prompt with one output token."""
    body = {"prompt": fresh_prompt(chars), "n_predict": 1, "temperature": 0, "cache_prompt": False}
    started = time.perf_counter()
    response = await client.post(f"{box_url}/completion", json=body)
    elapsed_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed_ms, int(response.json()["timings"]["prompt_n"])


async def _run_step(
    client: httpx.AsyncClient,
    box_url: str,
    serve_url: str,
    *,
    load_tokens_per_second: float,
    load_chars: int,
    probe_chars: int,
    probe_interval: float,
    settle_seconds: float,
    measure_seconds: float,
) -> _Step:
    """Offer the load for settle + measure seconds; figures only from the measure part."""
    step = _Step()
    measuring = False
    in_flight: set[asyncio.Task[None]] = set()
    stop = asyncio.Event()

    async def one_load() -> None:
        _, tokens = await _complete(client, box_url, load_chars)
        if measuring:
            step.computed_tokens += tokens

    async def load() -> None:
        if load_tokens_per_second <= 0:
            return
        spacing = load_chars / load_tokens_per_second
        next_at = time.monotonic()
        while not stop.is_set():
            if len(in_flight) >= MAX_IN_FLIGHT:
                step.dropped += int(measuring)
            else:
                task = asyncio.create_task(one_load())
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            next_at += spacing
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def probes() -> None:
        while not stop.is_set():
            started = time.monotonic()
            ms, tokens = await _complete(client, box_url, probe_chars)
            if measuring:
                step.ttft_ms.append(ms)
                step.computed_tokens += tokens
            await asyncio.sleep(max(0.0, probe_interval - (time.monotonic() - started)))

    async def sample() -> None:
        while not stop.is_set():
            response = await client.get(f"{serve_url}/v1/capacity")
            response.raise_for_status()
            if measuring:
                step.capacity.append(response.json())
            await asyncio.sleep(1.0)

    workers = [asyncio.create_task(w()) for w in (load, probes, sample)]
    await asyncio.sleep(settle_seconds)
    measuring = True
    await asyncio.sleep(measure_seconds)
    measuring = False
    stop.set()
    await asyncio.gather(*workers)
    await asyncio.gather(*in_flight)  # drain the backlog before the next step (not measured)
    return step


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


async def _measure(box_url: str, serve_url: str, box_id: str, args: argparse.Namespace) -> list[StepFigures]:
    async with httpx.AsyncClient(timeout=300) as client:
        report = (await client.get(f"{serve_url}/v1/capacity")).json()
        ceiling = float(report["boxes"][box_id]["ceiling_tokens_per_second"])
        source = report["boxes"][box_id]["ceiling_source"]
        probe_rate = args.probe_chars / args.probe_interval
        print(
            f"ceiling {ceiling:.0f} tok/s ({source}); probes {args.probe_chars} chars every "
            f"{args.probe_interval:.1f} s (~{probe_rate / ceiling:.0%} of the ceiling)",
            flush=True,
        )
        raw: list[tuple[int, float, _Step]] = []
        for percent in args.steps:
            offered = max(probe_rate, ceiling * percent / 100)
            step = await _run_step(
                client,
                box_url,
                serve_url,
                load_tokens_per_second=offered - probe_rate,
                load_chars=args.load_chars,
                probe_chars=args.probe_chars,
                probe_interval=args.probe_interval,
                settle_seconds=args.settle_seconds,
                measure_seconds=args.step_seconds,
            )
            raw.append((percent, offered, step))
            agent_headroom = [
                e["agents"][AGENT]["headroom_tokens_per_second"]
                for e in step.capacity
                if e["agents"].get(AGENT, {}).get("headroom_tokens_per_second") is not None
            ]
            print(
                f"  {percent:3d}%: engine {step.computed_tokens / args.step_seconds:5.0f} tok/s, headroom "
                f"{_mean(agent_headroom) or float('nan'):6.0f}, "
                f"TTFT p50 {percentile(step.ttft_ms, 0.5) or 0:5.0f} ms, "
                f"dropped {step.dropped}",
                flush=True,
            )
    idle = next(s for p, _, s in raw if p == min(args.steps))
    idle_p50 = percentile(idle.ttft_ms, 0.5) or 1.0
    idle_p90 = percentile(idle.ttft_ms, 0.9) or 1.0
    figures = []
    for percent, offered, step in raw:
        headroom = _mean(
            [
                e["agents"][AGENT]["headroom_tokens_per_second"]
                for e in step.capacity
                if e["agents"].get(AGENT, {}).get("headroom_tokens_per_second") is not None
            ]
        )
        used = _mean(
            [
                e["boxes"][box_id]["used_tokens_per_second"]
                for e in step.capacity
                if e["boxes"][box_id]["used_tokens_per_second"] is not None
            ]
        )
        box_headroom = _mean(
            [
                e["boxes"][box_id]["headroom_tokens_per_second"]
                for e in step.capacity
                if e["boxes"][box_id]["headroom_tokens_per_second"] is not None
            ]
        )
        unrouted = sum(1 for e in step.capacity if not e["agents"].get(AGENT, {}).get("boxes"))
        p50 = percentile(step.ttft_ms, 0.5) or 0.0
        p90 = percentile(step.ttft_ms, 0.9) or 0.0
        figures.append(
            StepFigures(
                load_percent=percent,
                offered_tokens_per_second=offered,
                engine_tokens_per_second=step.computed_tokens / args.step_seconds,
                counter_tokens_per_second=used,
                headroom_tokens_per_second=headroom,
                headroom_fraction=None if headroom is None else headroom / ceiling,
                box_headroom_tokens_per_second=box_headroom,
                unrouted_samples=unrouted,
                samples=len(step.capacity),
                ttft_p50_ms=p50,
                ttft_p90_ms=p90,
                ttft_p50_ratio=p50 / idle_p50,
                ttft_p90_ratio=p90 / idle_p90,
                probes=len(step.ttft_ms),
                dropped=step.dropped,
            )
        )
    return figures


def _headroom_known(base_url: str) -> bool:
    entry = httpx.get(f"{base_url}/v1/capacity", timeout=10).json()["agents"].get(AGENT)
    return entry is not None and entry["headroom_tokens_per_second"] is not None


def _percents(text: str) -> list[int]:
    values = sorted({int(v) for v in text.split(",") if v.strip()})
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError("steps: comma-separated percentages >= 0")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=_percents, default=list(DEFAULT_STEPS), help="%% of the ceiling")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="measured part of each step")
    parser.add_argument("--settle-seconds", type=float, default=4.0, help="load before measuring a step")
    parser.add_argument("--load-chars", type=int, default=400, help="size of a load prompt (~tokens)")
    parser.add_argument("--probe-chars", type=int, default=128, help="size of a probe prompt (~tokens)")
    parser.add_argument("--probe-interval", type=float, default=1.0, help="seconds between probe starts")
    parser.add_argument("--serve-log", type=Path, help="keep a copy of the daemon's log here")
    parser.add_argument("--quick", action="store_true", help="12 s steps (about 3 minutes in all)")
    args = parser.parse_args()
    if args.quick:
        args.step_seconds, args.settle_seconds = 12.0, 3.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warmer-bench-capacity-") as tmp:
        workdir = Path(tmp)
        fleet = LlamaFleet(
            1,
            binary=ensure_llama_server(),
            model=ensure_tiny_model(),
            slots=2,
            ctx_per_slot=4096,
            log_dir=workdir / "logs",
        )
        with fleet:
            box = fleet.boxes[0]
            port = free_loopback_port()
            config = write_config(workdir, fleet_boxes(fleet), port, sections=CAPACITY_SECTIONS)
            with running_serve(config, port, workdir / "serve.log") as serve:
                serve.wait("a measured headroom for the agent", lambda: _headroom_known(serve.base_url))
                # let the warm-up's own prefills leave the counter window
                time.sleep(2 * CAPACITY_POLL_SECONDS)
                steps = asyncio.run(_measure(box.base_url, serve.base_url, box.id, args))
                serve.stop()
            if args.serve_log is not None:
                shutil.copy(workdir / "serve.log", args.serve_log)
    print()
    print(markdown_table(steps))
    found = crossings(steps)
    print(
        f"\nfrom this step on: headroom <= 0 at {found.headroom_zero_percent}%; TTFT p50 >= {BREAK_RATIO}x "
        f"idle at {found.ttft_p50_break_percent}%, p90 at {found.ttft_p90_break_percent}% "
        f"(None: not reached); {time.monotonic() - started:.0f} s in all"
    )


if __name__ == "__main__":
    main()
