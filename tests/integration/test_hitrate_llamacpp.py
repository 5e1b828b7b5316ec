"""Hit rate from a real llama-server's /metrics equals what its own responses said (timings.cache_n/prompt_n).

This pins the counter semantics `cache_stats_from_samples` relies on: `llamacpp:prompt_tokens_total`
counts computed prompt tokens only, `llamacpp:prompt_tokens_cached_total` the reused ones.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from click.testing import CliRunner

from testbed.fleet import LlamaFleet
from warmer.cli.hitrate import hitrate
from warmer.core.hitrate import cache_stats_from_metrics, hit_rate_between
from warmer.core.model import CacheStats, EngineKind

pytestmark = pytest.mark.integration

PREFIX = "".join(f"Rule {i}: keep answers short and polite. " for i in range(30))


def scrape(base_url: str) -> CacheStats:
    return cache_stats_from_metrics(EngineKind.LLAMACPP, httpx.get(f"{base_url}/metrics", timeout=10).text)


def test_metrics_window_matches_the_responses(llama_fleet_factory: Callable[..., LlamaFleet]) -> None:
    box = llama_fleet_factory(1).boxes[0]
    before = scrape(box.base_url)
    computed = reused = 0
    for suffix in ("Caller: hi.", "Caller: hello?", "Caller: who is this?"):
        body = {"prompt": PREFIX + suffix, "n_predict": 1, "temperature": 0, "cache_prompt": True}
        timings = httpx.post(f"{box.base_url}/completion", json=body, timeout=120).json()["timings"]
        computed += timings["prompt_n"]
        reused += timings["cache_n"]
    assert reused > 0, "the second and third requests reuse the shared prefix"
    after = scrape(box.base_url)
    window = hit_rate_between(before, after)
    assert (window.queried_tokens, window.hit_tokens) == (computed + reused, reused)
    assert window.hit_rate == pytest.approx(reused / (computed + reused))

    result = CliRunner().invoke(hitrate, ["--metrics-url", f"{box.base_url}/metrics", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["engine"] == "llamacpp"
    assert data["window"]["hit_tokens"] == after.hit_tokens
    assert data["window"]["queried_tokens"] == after.queried_tokens
