"""Cache hit rates from what the engines themselves report: SGLang server logs and /metrics counters.

Hit rate is capacity, so it is measured from the engine's own numbers, never inferred.
Two sources:

* SGLang scheduler log lines, one per prefill batch. Format, from sgl-project/sglang
  `python/sglang/srt/managers/scheduler_metrics_mixin.py` (`log_prefill_stats`):
  ``Prefill batch, #new-seq: 1, #new-token: 212, #cached-token: 3400, token usage: 0.01, ...``;
  older releases (`python/sglang/srt/managers/scheduler.py`) wrote ``Prefill batch. #new-seq: ...``,
  and with ``LOG_FORWARD_ITERS`` the batch carries its iteration: ``Prefill batch [42], #new-seq: ...``.
  What follows ``#cached-token`` (token usage, mamba usage, queue sizes, throughput) varies by
  version and is ignored. Health checks and warm-up pings make tiny prefills that drag the share
  down, so prefills below a token floor are left out (the field report used 1,000).
* Prometheus counters on ``/metrics`` (see `cache_stats_from_samples` for the names per engine). That
  function is the one rule: the CLI (`warmer hitrate`), the engine adapters (`EnginePort.cache_stats`) and
  through them the daemon's hit-rate monitor all read counters through it.
"""

from __future__ import annotations

import enum
import re
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from warmer.core.model import CacheStats, EngineKind
from warmer.core.promtext import Sample, parse_prometheus_text, sum_samples

DEFAULT_MIN_PREFILL_TOKENS = 1000
DEFAULT_HIT_RATE_THRESHOLD = 0.90

_PREFILL_LINE = re.compile(
    r"Prefill batch(?:\s*\[\d+\])?\s*[.,]?\s*"
    r"#new-seq:\s*(?P<seqs>\d+),\s*"
    r"#new-token:\s*(?P<new>\d+),\s*"
    r"#cached-token:\s*(?P<cached>\d+)"
)


# --------------------------------------------------------------------------- SGLang server log


@dataclass(frozen=True, slots=True)
class PrefillLine:
    """One `Prefill batch` log line: tokens computed (`new`) and tokens reused from the cache."""

    new_tokens: int
    cached_tokens: int
    new_seqs: int
    line_no: int

    @property
    def prompt_tokens(self) -> int:
        return self.new_tokens + self.cached_tokens


def parse_prefill_line(line: str, line_no: int = 0) -> PrefillLine | None:
    """The prefill counts on an SGLang log line, or None when the line is not a prefill batch."""
    match = _PREFILL_LINE.search(line)
    if match is None:
        return None
    return PrefillLine(
        new_tokens=int(match["new"]),
        cached_tokens=int(match["cached"]),
        new_seqs=int(match["seqs"]),
        line_no=line_no,
    )


@dataclass(frozen=True, slots=True)
class ValueCount:
    """How many counted prefills reused exactly `cached_tokens` tokens."""

    cached_tokens: int
    count: int
    share: float  # of counted prefills


@dataclass(frozen=True, slots=True)
class CachedTokenSpike:
    """A single cached-token value that dominates the distribution.

    `suspicious` means those prefills reuse only a small part of their prompts: the cached run
    stops at the same token every time, which is what a per-call value sitting at that point in
    the prompt looks like (the field report's spike at exactly 1,024). A dominant value that covers
    most of the prompt is just the healthy stable prefix.
    """

    cached_tokens: int
    count: int
    share: float
    median_prompt_tokens: float
    cached_fraction_of_prompt: float
    suspicious: bool


@dataclass(frozen=True, slots=True)
class Bucket:
    """A power-of-two range of cached tokens per prefill: [low, high)."""

    low: int
    high: int
    count: int


@dataclass(frozen=True, slots=True)
class SglangLogReport:
    """Cached share of prompt processing from an SGLang log, with the distribution behind it."""

    min_tokens: int
    prefill_lines: int  # every `Prefill batch` line seen
    counted_prefills: int  # those at or above the token floor
    ignored_small_prefills: int
    new_tokens: int
    cached_tokens: int
    zero_hit_prefills: int
    multi_seq_batches: int  # counted lines that batched several new requests (their tokens are summed)
    top_values: tuple[ValueCount, ...]
    buckets: tuple[Bucket, ...]
    spike: CachedTokenSpike | None

    @property
    def prompt_tokens(self) -> int:
        return self.new_tokens + self.cached_tokens

    @property
    def cached_share(self) -> float | None:
        """cached / (new + cached) over the counted prefills; None when nothing was counted."""
        total = self.prompt_tokens
        return self.cached_tokens / total if total else None


def cached_token_buckets(values: Iterable[int]) -> tuple[Bucket, ...]:
    """Counts per power-of-two range of cached tokens ([0, 1) holds the zero hits)."""
    counts: Counter[int] = Counter()
    for value in values:
        counts[0 if value == 0 else value.bit_length()] += 1
    out: list[Bucket] = []
    for key in sorted(counts):
        low, high = (0, 1) if key == 0 else (1 << (key - 1), 1 << key)
        out.append(Bucket(low=low, high=high, count=counts[key]))
    return tuple(out)


def find_spike(
    counted: Sequence[tuple[int, int]], *, min_share: float, min_count: int, broken_below: float
) -> CachedTokenSpike | None:
    """The most common non-zero cached count among (prompt tokens, cached tokens) pairs, when it holds at
    least `min_share` of them and `min_count` in all; suspicious when it covers less than `broken_below` of
    those prompts. Shared by the SGLang log report and the call-record report (`warmer.core.call_report`)."""
    nonzero = Counter(cached for _, cached in counted if cached > 0)
    if not nonzero or not counted:
        return None
    value, count = max(nonzero.items(), key=lambda item: (item[1], -item[0]))
    share = count / len(counted)
    if count < min_count or share < min_share:
        return None
    prompts = [prompt for prompt, cached in counted if cached == value]
    median_prompt = float(statistics.median(prompts))
    fraction = value / median_prompt if median_prompt else 1.0
    return CachedTokenSpike(
        cached_tokens=value,
        count=count,
        share=share,
        median_prompt_tokens=median_prompt,
        cached_fraction_of_prompt=fraction,
        suspicious=fraction < broken_below,
    )


def analyze_sglang_log(
    lines: Iterable[str],
    *,
    min_tokens: int = DEFAULT_MIN_PREFILL_TOKENS,
    top: int = 10,
    spike_min_share: float = 0.2,
    spike_min_count: int = 5,
    broken_below: float = 0.5,
) -> SglangLogReport:
    """Cached share and cached-token distribution over the prefills of at least `min_tokens` tokens.

    A prefill counts when new + cached >= `min_tokens` (health checks and pings fall below).
    A spike is the most common non-zero cached value when it holds at least `spike_min_share` of
    the counted prefills and `spike_min_count` of them; it is suspicious when it covers less than
    `broken_below` of those prompts.
    """
    if min_tokens < 0:
        raise ValueError("min_tokens must be >= 0")
    if top < 0:
        raise ValueError("top must be >= 0")
    seen = 0
    counted: list[PrefillLine] = []
    for line_no, line in enumerate(lines, start=1):
        prefill = parse_prefill_line(line, line_no)
        if prefill is None:
            continue
        seen += 1
        if prefill.prompt_tokens >= min_tokens:
            counted.append(prefill)
    values = Counter(p.cached_tokens for p in counted)
    ranked = sorted(values.items(), key=lambda item: (-item[1], -item[0]))[:top]
    total = len(counted)
    return SglangLogReport(
        min_tokens=min_tokens,
        prefill_lines=seen,
        counted_prefills=total,
        ignored_small_prefills=seen - total,
        new_tokens=sum(p.new_tokens for p in counted),
        cached_tokens=sum(p.cached_tokens for p in counted),
        zero_hit_prefills=values.get(0, 0),
        multi_seq_batches=sum(1 for p in counted if p.new_seqs > 1),
        top_values=tuple(ValueCount(value, count, count / total) for value, count in ranked),
        buckets=cached_token_buckets(p.cached_tokens for p in counted),
        spike=find_spike(
            [(p.prompt_tokens, p.cached_tokens) for p in counted],
            min_share=spike_min_share,
            min_count=spike_min_count,
            broken_below=broken_below,
        ),
    )


# --------------------------------------------------------------------------- /metrics counters


def detect_engine(samples: Iterable[Sample]) -> EngineKind | None:
    """Which engine wrote a /metrics page, from its metric-name prefix."""
    prefixes = {s.name.split(":", 1)[0] for s in samples if ":" in s.name}
    for kind in (EngineKind.VLLM, EngineKind.SGLANG, EngineKind.LLAMACPP):
        if kind.value in prefixes:  # the metric prefixes are the engine kind names
            return kind
    return None


def _first_present(samples: Sequence[Sample], *names: str) -> float | None:
    for name in names:
        value = sum_samples(samples, name)
        if value is not None:
            return value
    return None


# The counter names per engine, first the current spelling then older ones (summed over every series).
CACHE_COUNTERS: dict[EngineKind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    EngineKind.VLLM: (
        ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    ),
    EngineKind.SGLANG: (("sglang:prompt_tokens_total",), ("sglang:cached_tokens_total",)),
    EngineKind.LLAMACPP: (("llamacpp:prompt_tokens_total",), ("llamacpp:prompt_tokens_cached_total",)),
}


def cache_stats_from_samples(engine: EngineKind, samples: Sequence[Sample]) -> CacheStats:
    """An engine's cumulative prefix-cache counters, summed over every series (models, sources, ranks).

    * vLLM (`vllm/v1/metrics/loggers.py`): `vllm:prefix_cache_queries_total` and
      `vllm:prefix_cache_hits_total`, both in tokens; releases before the rename spelled them
      `vllm:gpu_prefix_cache_queries_total` / `vllm:gpu_prefix_cache_hits_total`.
    * SGLang (`python/sglang/srt/metrics/collector.py`): `sglang:prompt_tokens_total` (every prompt
      token) and `sglang:cached_tokens_total` (labelled by `cache_source` device/host/storage on
      newer releases: all are tokens not recomputed). `sglang:cache_hit_rate` is NOT read: it is a gauge of
      the last batch only, not a rate over any window warmer judges.
    * llama.cpp (`tools/server`, `server_task_result_metrics::to_metrics`, needs `--metrics`):
      `llamacpp:prompt_tokens_total` counts prompt tokens processed EXCLUDING cached ones and
      `llamacpp:prompt_tokens_cached_total` the reused ones, so queried = processed + cached.
    * a generic OpenAI-compatible server: whichever of the above its metric names say it is.

    A counter that is absent is None, never 0.
    """
    samples = list(samples)
    if engine is EngineKind.OPENAI:
        detected = detect_engine(samples)
        if detected is None:
            raise ValueError("/metrics has no vllm:, sglang: or llamacpp: counters")
        engine = detected
    names = CACHE_COUNTERS.get(engine)
    if names is None:
        raise ValueError(f"engine {engine.value!r} exposes no prefix-cache counters warmer knows")
    queried_names, hit_names = names
    queried = _first_present(samples, *queried_names)
    hits = _first_present(samples, *hit_names)
    if engine is EngineKind.LLAMACPP:
        queried = None if queried is None or hits is None else queried + hits
    return CacheStats(queried_tokens=queried, hit_tokens=hits)


def cache_stats_from_metrics(engine: EngineKind, text: str) -> CacheStats:
    """Parse a /metrics body and read the engine's prefix-cache counters from it."""
    return cache_stats_from_samples(engine, parse_prometheus_text(text))


class HitRateSource(enum.StrEnum):
    COUNTERS = "counters"  # from token counters: exact
    NONE = "none"


@dataclass(frozen=True, slots=True)
class HitRateWindow:
    """Hit rate over a span: cumulative since start, or between two scrapes."""

    hit_rate: float | None
    queried_tokens: float | None
    hit_tokens: float | None
    source: HitRateSource
    counters_reset: bool = False  # the engine restarted in between: only the later scrape counts


def cumulative_hit_rate(stats: CacheStats) -> HitRateWindow:
    """Hit rate since the engine started, from one scrape."""
    if stats.queried_tokens is not None and stats.hit_tokens is not None:
        rate = stats.hit_tokens / stats.queried_tokens if stats.queried_tokens > 0 else None
        return HitRateWindow(rate, stats.queried_tokens, stats.hit_tokens, HitRateSource.COUNTERS)
    return HitRateWindow(None, None, None, HitRateSource.NONE)


def hit_rate_between(before: CacheStats, after: CacheStats) -> HitRateWindow:
    """Hit rate of the traffic between two scrapes of the same engine.

    Counters only grow; if either went down the engine restarted, so the later scrape alone is
    the traffic since then. No queried tokens in between gives a rate of None (no traffic), not 0.
    """
    b_queried, b_hits = before.queried_tokens, before.hit_tokens
    a_queried, a_hits = after.queried_tokens, after.hit_tokens
    if b_queried is None or b_hits is None or a_queried is None or a_hits is None:
        return HitRateWindow(None, None, None, HitRateSource.NONE)
    queried, hits = a_queried - b_queried, a_hits - b_hits
    reset = queried < 0 or hits < 0
    if reset:
        queried, hits = a_queried, a_hits
    rate = hits / queried if queried > 0 else None
    return HitRateWindow(rate, queried, hits, HitRateSource.COUNTERS, counters_reset=reset)


class HitRateStatus(enum.StrEnum):
    OK = "ok"
    BELOW_THRESHOLD = "below_threshold"
    NO_DATA = "no_data"  # no traffic (or too little) to judge


@dataclass(frozen=True, slots=True)
class HitRateCheck:
    status: HitRateStatus
    hit_rate: float | None
    threshold: float

    @property
    def alert(self) -> bool:
        return self.status is HitRateStatus.BELOW_THRESHOLD


def check_hit_rate(
    window: HitRateWindow,
    *,
    threshold: float = DEFAULT_HIT_RATE_THRESHOLD,
    min_queried_tokens: float = 0.0,
) -> HitRateCheck:
    """Compare a hit rate with the alert threshold (default 90%: the field reports' healthy bar).

    Windows with fewer than `min_queried_tokens` queried tokens are NO_DATA, so a quiet minute with
    one health check cannot raise an alert.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError("threshold must be within [0, 1]")
    if window.hit_rate is None:
        return HitRateCheck(HitRateStatus.NO_DATA, None, threshold)
    if window.queried_tokens is not None and window.queried_tokens < min_queried_tokens:
        return HitRateCheck(HitRateStatus.NO_DATA, window.hit_rate, threshold)
    status = HitRateStatus.OK if window.hit_rate >= threshold else HitRateStatus.BELOW_THRESHOLD
    return HitRateCheck(status, window.hit_rate, threshold)
