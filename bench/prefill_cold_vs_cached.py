"""How much slower is a cold prefill than a cached one on the generated test model?

The test bench is only useful if "warm" is visibly cheaper than "cold" (target: >= 20x for a
3k-token prompt). Each repetition sends a fresh 3k-token prompt (cold: nothing shared but a few leading
tokens) and then the identical prompt again (cached: only the last token is recomputed). Reported are
the server's own `timings.prompt_ms` and the client-side wall time, median over repetitions.

    .venv/bin/python -m bench.prefill_cold_vs_cached [--tokens 3000] [--reps 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

from testbed.fleet import LlamaBox, LlamaFleet
from testbed.llama_build import ensure_llama_server
from testbed.tiny_model import ensure_tiny_model


@dataclass(frozen=True)
class Sample:
    prompt_n: int
    cache_n: int
    prompt_ms: float
    wall_ms: float


def _prompt_tokens(client: httpx.Client, box: LlamaBox, rep: int, n_tokens: int) -> list[int]:
    """A prompt of exactly n_tokens (BOS included) that differs from other repetitions right after BOS."""
    # The first byte differs between repetitions, so a cold prompt shares only BOS + the space mark.
    body = "".join(f"Ticket {i} needs a short, polite answer. " for i in range(n_tokens))
    text = f"{chr(65 + rep % 26)}{rep:04d}. {body}"
    response = client.post(f"{box.base_url}/tokenize", json={"content": text, "add_special": True})
    response.raise_for_status()
    tokens: list[int] = response.json()["tokens"]
    if len(tokens) < n_tokens:
        raise RuntimeError(f"generated text tokenized to {len(tokens)} < {n_tokens} tokens")
    return tokens[:n_tokens]


def _complete(client: httpx.Client, box: LlamaBox, prompt: list[int]) -> Sample:
    started = time.perf_counter()
    response = client.post(
        f"{box.base_url}/completion", json={"prompt": prompt, "n_predict": 1, "cache_prompt": True}
    )
    wall_ms = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    timings: dict[str, Any] = response.json()["timings"]
    return Sample(int(timings["prompt_n"]), int(timings["cache_n"]), float(timings["prompt_ms"]), wall_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000, help="prompt length in tokens (default 3000)")
    parser.add_argument("--reps", type=int, default=7, help="repetitions; medians are reported (default 7)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads (default 2)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()

    binary, model = ensure_llama_server(), ensure_tiny_model(layers=args.layers, width=args.width)
    ctx = max(4096, args.tokens + 64)
    cold: list[Sample] = []
    cached: list[Sample] = []
    with (
        LlamaFleet(1, binary=binary, model=model, slots=1, ctx_per_slot=ctx, threads=args.threads) as fleet,
        httpx.Client(timeout=300.0) as client,
    ):
        (box,) = fleet.boxes
        _complete(client, box, _prompt_tokens(client, box, -1, 64))  # first-request allocation, not measured
        for rep in range(args.reps):
            prompt = _prompt_tokens(client, box, rep, args.tokens)
            cold.append(_complete(client, box, prompt))
            cached.append(_complete(client, box, prompt))

    def median(samples: list[Sample], field: str) -> float:
        return float(statistics.median(float(getattr(s, field)) for s in samples))

    cpu = platform.processor() or platform.machine()
    size_mb = model.stat().st_size / 1e6
    print(f"model: {model.name} ({size_mb:.0f} MB), threads {args.threads}, cpu {cpu}")
    print(f"prompt: {args.tokens} tokens, {args.reps} repetitions (medians)")
    print(
        f"cold:   prompt_n {median(cold, 'prompt_n'):.0f}, cache_n {median(cold, 'cache_n'):.0f}, "
        f"prompt_ms {median(cold, 'prompt_ms'):.1f}, wall {median(cold, 'wall_ms'):.1f} ms"
    )
    print(
        f"cached: prompt_n {median(cached, 'prompt_n'):.0f}, cache_n {median(cached, 'cache_n'):.0f}, "
        f"prompt_ms {median(cached, 'prompt_ms'):.1f}, wall {median(cached, 'wall_ms'):.1f} ms"
    )
    print(
        f"ratio cold/cached: prompt_ms {median(cold, 'prompt_ms') / median(cached, 'prompt_ms'):.0f}x, "
        f"wall {median(cold, 'wall_ms') / median(cached, 'wall_ms'):.0f}x"
    )


if __name__ == "__main__":
    main()
