"""`python -m testbed simfleet`: a simulated fleet until Ctrl-C / SIGTERM, and its `[[fleet.boxes]]` file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from pathlib import Path

from testbed.simfleet.box import BoxConfig, SimEngine
from testbed.simfleet.run import running_simfleet, serve
from testbed.simfleet.tokens import DEFAULT_TOKENIZER


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = BoxConfig()
    parser.add_argument("--boxes", type=int, default=100, help="number of boxes (default 100)")
    parser.add_argument(
        "--processes", type=int, default=1, help="sim processes to spread them over (default 1)"
    )
    parser.add_argument("--engine", choices=[e.value for e in SimEngine], default=defaults.engine.value)
    parser.add_argument(
        "--model", default=defaults.model, help="the boxes' model profile name in the fleet file"
    )
    parser.add_argument(
        "--port", type=int, default=0, help="first loopback port (process k: PORT + k; 0: free ports)"
    )
    parser.add_argument("--slots", type=int, default=defaults.slots, help="concurrent requests per box")
    parser.add_argument(
        "--context-tokens", type=int, default=defaults.context_tokens, help="context per slot"
    )
    parser.add_argument(
        "--cache-tokens", type=int, default=defaults.cache_tokens, help="prefix cache per box (tokens)"
    )
    parser.add_argument(
        "--block-tokens",
        type=int,
        default=defaults.block_tokens,
        help="hit granularity (vLLM block_size, SGLang page_size)",
    )
    parser.add_argument(
        "--prefill-tokens-per-second",
        type=float,
        default=defaults.prefill_tokens_per_second,
        help="uncached prompt tokens a box computes per second, shared by its slots",
    )
    parser.add_argument("--decode-seconds-per-token", type=float, default=defaults.decode_seconds_per_token)
    parser.add_argument("--id-prefix", default="sim-", help="box ids are PREFIX + index (default sim-)")
    parser.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="a tokenizers JSON file")
    parser.add_argument("--fleet-file", type=Path, default=None, help="write the [[fleet.boxes]] TOML here")
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)


def _config(args: argparse.Namespace) -> BoxConfig:
    return BoxConfig(
        engine=SimEngine(args.engine),
        model=args.model,
        slots=args.slots,
        context_tokens=args.context_tokens,
        cache_tokens=args.cache_tokens,
        block_tokens=args.block_tokens,
        prefill_tokens_per_second=args.prefill_tokens_per_second,
        decode_seconds_per_token=args.decode_seconds_per_token,
    )


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.boxes < 1 or args.processes < 1:
        parser.error("--boxes and --processes must be >= 1")
    try:
        config = _config(args)
    except ValueError as exc:
        parser.error(str(exc))
    if args.serve_only:
        import uvloop

        uvloop.install()
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(
                    config,
                    count=args.boxes,
                    first=args.first,
                    port=args.port,
                    id_prefix=args.id_prefix,
                    tokenizer=args.tokenizer,
                )
            )
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    with running_simfleet(
        args.boxes,
        config,
        processes=args.processes,
        port=args.port,
        id_prefix=args.id_prefix,
        tokenizer=args.tokenizer,
    ) as fleet:
        toml = fleet.toml()
        if args.fleet_file is not None:
            args.fleet_file.write_text(toml)
        else:
            print(toml, flush=True)
        ports = ", ".join(
            f"{p.url} (pid {p.pid}, boxes {p.first}..{p.first + p.count - 1})" for p in fleet.processes
        )
        where = f" in {args.fleet_file}" if args.fleet_file else ""
        print(
            f"{args.boxes} simulated {args.engine} box(es){where}; control routes: {ports}/_sim/...",
            file=sys.stderr,
            flush=True,
        )
        while not stop.wait(1.0):
            pass
    return 0
