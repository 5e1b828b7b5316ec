"""Hit rates from SGLang logs and engine /metrics pages, and the `warmer hitrate` command."""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.adapters.engines.openai import OpenAICompatibleEngine
from warmer.adapters.engines.sglang import SglangEngine
from warmer.adapters.engines.vllm import VllmEngine
from warmer.cli.exits import Exit
from warmer.cli.hitrate import hitrate
from warmer.core.hitrate import (
    HitRateSource,
    HitRateStatus,
    analyze_sglang_log,
    cache_stats_from_metrics,
    check_hit_rate,
    cumulative_hit_rate,
    detect_engine,
    hit_rate_between,
    parse_prefill_line,
)
from warmer.core.model import BoxSpec, CacheStats, EngineKind
from warmer.core.promtext import MetricsTextError, parse_prometheus_text

SAMPLE_LOG = Path(__file__).parent.parent / "data" / "sglang_server.log"

# Hand count of tests/data/sglang_server.log, prefills of >= 1,000 prompt tokens (16 of its 25):
#   cold:          7204 + 7211 new, 0 cached
#   broken prefix: 8 prefills of 1024 cached; new 6178 6181 6176 6190 6183 6179 6185 6188 (= 49,460)
#   healthy:       4 prefills of 7040 cached; new 158 162 171 149 (= 640)
#   2-request batch: 12,362 new, 2,048 cached;  short prompt: 936 new, 64 cached (exactly 1,000)
# new = 7204 + 7211 + 49460 + 640 + 12362 + 936 = 77,813; cached = 8*1024 + 4*7040 + 2048 + 64 = 38,464
# Ignored (< 1,000 tokens): the start-up generate (7), six health checks (5, 4+1 x5), pings of 999 and 998.
HAND_NEW = 77_813
HAND_CACHED = 38_464
HAND_SHARE = 38_464 / (77_813 + 38_464)


def field_report_share(path: Path, floor: int) -> float:
    """The field report's own few-line computation, as an independent check (with >= as the floor)."""
    new = cached = 0
    for line in path.read_text().splitlines():
        match = re.search(r"Prefill batch.*#new-token: (\d+), #cached-token: (\d+)", line)
        if match and int(match[1]) + int(match[2]) >= floor:
            new += int(match[1])
            cached += int(match[2])
    return cached / (new + cached)


# ------------------------------------------------------------------------------------------ log lines


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (  # current scheduler_metrics_mixin.py
            "[2025-06-12 09:15:13 TP0] Prefill batch, #new-seq: 1, #new-token: 212, #cached-token: 3400, "
            "token usage: 0.02, #running-req: 0, #queue-req: 0, #pending-token: 0, ",
            (1, 212, 3400),
        ),
        (  # older scheduler.py, with DP attention rank tags
            "[2025-04-01 04:00:11 DP0 TP0] Prefill batch. #new-seq: 1, #new-token: 5, #cached-token: 1, "
            "token usage: 0.00, #running-req: 0, #queue-req: 0, ",
            (1, 5, 1),
        ),
        (  # LOG_FORWARD_ITERS and a hybrid model's mamba usage
            "[2026-09-22 01:06:11] Prefill batch [881], #new-seq: 4, #new-token: 2048, #cached-token: 35330, "
            "full token usage: 0.43, mamba usage: 0.72, #running-req: 26, #queue-req: 55,",
            (4, 2048, 35330),
        ),
    ],
)
def test_prefill_line_formats_across_versions(line: str, expected: tuple[int, int, int]) -> None:
    prefill = parse_prefill_line(line, 7)
    assert prefill is not None
    assert (prefill.new_seqs, prefill.new_tokens, prefill.cached_tokens) == expected
    assert prefill.prompt_tokens == expected[1] + expected[2]
    assert prefill.line_no == 7


@pytest.mark.parametrize(
    "line",
    [
        "[2025-06-12 09:15:14 TP0] Decode batch, #running-req: 1, #token: 7242, token usage: 0.02, ",
        '[2025-06-12 09:15:13] INFO:     10.0.4.17:51209 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        "",
    ],
)
def test_other_lines_are_not_prefills(line: str) -> None:
    assert parse_prefill_line(line) is None


# ------------------------------------------------------------------------------------------ the sample


def test_sample_log_share_matches_the_hand_count() -> None:
    with SAMPLE_LOG.open() as lines:
        report = analyze_sglang_log(lines)
    assert report.prefill_lines == 25
    assert report.counted_prefills == 16
    assert report.ignored_small_prefills == 9
    assert (report.new_tokens, report.cached_tokens) == (HAND_NEW, HAND_CACHED)
    assert report.cached_share == pytest.approx(HAND_SHARE)
    assert report.cached_share == pytest.approx(field_report_share(SAMPLE_LOG, 1000))
    assert report.zero_hit_prefills == 2
    assert report.multi_seq_batches == 1


def test_sample_log_spike_at_1024_is_flagged() -> None:
    with SAMPLE_LOG.open() as lines:
        report = analyze_sglang_log(lines)
    top = report.top_values[0]
    assert (top.cached_tokens, top.count, top.share) == (1024, 8, 0.5)
    assert [(v.cached_tokens, v.count) for v in report.top_values[1:3]] == [(7040, 4), (0, 2)]
    spike = report.spike
    assert spike is not None
    assert spike.cached_tokens == 1024
    assert spike.count == 8
    assert spike.suspicious
    # the eight 1,024-token hits sit on prompts of 7,200..7,214 tokens: the run stops at 14% of them
    assert spike.median_prompt_tokens == pytest.approx((6181 + 6183) / 2 + 1024)
    assert spike.cached_fraction_of_prompt == pytest.approx(1024 / spike.median_prompt_tokens)
    bucket_1024 = next(b for b in report.buckets if b.low == 1024)
    assert (bucket_1024.high, bucket_1024.count) == (2048, 8)
    assert sum(b.count for b in report.buckets) == report.counted_prefills


def test_floor_counts_prefills_at_or_above_it() -> None:
    lines = [
        "Prefill batch, #new-seq: 1, #new-token: 999, #cached-token: 0, ",
        "Prefill batch, #new-seq: 1, #new-token: 900, #cached-token: 100, ",
    ]
    report = analyze_sglang_log(lines, min_tokens=1000)
    assert (report.counted_prefills, report.cached_tokens, report.new_tokens) == (1, 100, 900)
    everything = analyze_sglang_log(lines, min_tokens=0)
    assert everything.counted_prefills == 2
    assert everything.cached_share == pytest.approx(100 / 1999)


def test_health_checks_alone_give_no_share() -> None:
    report = analyze_sglang_log(["Prefill batch, #new-seq: 1, #new-token: 4, #cached-token: 1, "] * 20)
    assert report.counted_prefills == 0
    assert report.cached_share is None
    assert report.spike is None


def test_a_dominant_full_prefix_is_not_a_broken_one() -> None:
    healthy = [f"Prefill batch, #new-seq: 1, #new-token: {150 + i}, #cached-token: 7040, " for i in range(10)]
    report = analyze_sglang_log(healthy)
    assert report.spike is not None
    assert report.spike.cached_tokens == 7040
    assert not report.spike.suspicious
    assert report.cached_share == pytest.approx(70400 / (70400 + sum(150 + i for i in range(10))))


def test_scattered_values_make_no_spike() -> None:
    lines = [
        f"Prefill batch, #new-seq: 1, #new-token: 3000, #cached-token: {1000 + 37 * i}, " for i in range(10)
    ]
    assert analyze_sglang_log(lines).spike is None


# ------------------------------------------------------------------------------------------ /metrics

VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 3000.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 1000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 2560.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 640.0
"""

SGLANG_METRICS = """\
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m",tp_rank="0"} 20000.0
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{cache_source="device",model_name="m"} 15000.0
sglang:cached_tokens_total{cache_source="host",model_name="m"} 3000.0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m",dp_rank="0"} 0.8
sglang:cache_hit_rate{model_name="m",dp_rank="1"} 0.9
"""

LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1200
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 6000
llamacpp:requests_processing 0
"""


def test_vllm_counters_sum_over_series() -> None:
    stats = cache_stats_from_metrics(EngineKind.VLLM, VLLM_METRICS)
    assert stats == CacheStats(queried_tokens=4000.0, hit_tokens=3200.0)
    assert cumulative_hit_rate(stats).hit_rate == pytest.approx(0.8)


def test_vllm_older_gpu_prefixed_names() -> None:
    text = "vllm:gpu_prefix_cache_queries_total 500\nvllm:gpu_prefix_cache_hits_total 125\n"
    assert cache_stats_from_metrics(EngineKind.VLLM, text) == CacheStats(500.0, 125.0)


def test_sglang_counters_not_the_last_batch_gauge() -> None:
    stats = cache_stats_from_metrics(EngineKind.SGLANG, SGLANG_METRICS)
    assert stats == CacheStats(queried_tokens=20000.0, hit_tokens=18000.0)
    window = cumulative_hit_rate(stats)
    assert (window.hit_rate, window.source) == (pytest.approx(0.9), HitRateSource.COUNTERS)


def test_sglang_cache_hit_rate_gauge_alone_is_no_data() -> None:
    """sglang:cache_hit_rate describes the last batch only: it is never taken for a hit rate."""
    stats = cache_stats_from_metrics(EngineKind.SGLANG, 'sglang:cache_hit_rate{dp_rank="0"} 0.42\n')
    assert stats == CacheStats(None, None)
    assert cumulative_hit_rate(stats).source is HitRateSource.NONE


def test_llamacpp_queried_is_processed_plus_cached() -> None:
    stats = cache_stats_from_metrics(EngineKind.LLAMACPP, LLAMACPP_METRICS)
    assert stats == CacheStats(queried_tokens=7200.0, hit_tokens=6000.0)


def test_missing_counters_are_none_not_zero() -> None:
    stats = cache_stats_from_metrics(EngineKind.LLAMACPP, "llamacpp:requests_processing 0\n")
    assert stats == CacheStats(None, None)
    assert cumulative_hit_rate(stats).source is HitRateSource.NONE


def test_detect_engine_from_names() -> None:
    assert detect_engine(parse_prometheus_text(VLLM_METRICS)) is EngineKind.VLLM
    assert detect_engine(parse_prometheus_text(SGLANG_METRICS)) is EngineKind.SGLANG
    assert detect_engine(parse_prometheus_text(LLAMACPP_METRICS)) is EngineKind.LLAMACPP
    assert detect_engine(parse_prometheus_text("process_cpu_seconds_total 1\n")) is None


def test_openai_kind_reads_the_counters_its_names_show() -> None:
    assert cache_stats_from_metrics(EngineKind.OPENAI, VLLM_METRICS) == CacheStats(4000.0, 3200.0)
    with pytest.raises(ValueError, match="no vllm:, sglang: or llamacpp: counters"):
        cache_stats_from_metrics(EngineKind.OPENAI, "process_cpu_seconds_total 1\n")


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        (EngineKind.VLLM, VLLM_METRICS),
        (EngineKind.SGLANG, SGLANG_METRICS),
        (EngineKind.LLAMACPP, LLAMACPP_METRICS),
        (EngineKind.OPENAI, VLLM_METRICS),
        # Where the four mappings used to disagree: vLLM's pre-rename counter names, a llama-server
        # behind the generic adapter.
        (EngineKind.VLLM, "vllm:gpu_prefix_cache_queries_total 500\nvllm:gpu_prefix_cache_hits_total 125\n"),
        (EngineKind.OPENAI, LLAMACPP_METRICS),
    ],
)
def test_cli_and_daemon_read_the_same_figure_from_one_metrics_page(
    metrics_pages: MetricsPagesFactory, kind: EngineKind, text: str
) -> None:
    """One recorded /metrics body, served on loopback: `warmer hitrate` and the daemon's engine adapter
    (what the hit-rate monitor scrapes through EnginePort.cache_stats) report the same counters."""
    server = metrics_pages([text])
    cli = CliRunner().invoke(hitrate, ["--metrics-url", server.url, "--json"])
    assert cli.exit_code == 0, cli.output
    window = json.loads(cli.output)["window"]

    base_url = server.url.removesuffix("/metrics")
    box = BoxSpec(id="b", base_url=base_url, engine=kind, model="m")

    async def scrape() -> CacheStats:
        async with httpx.AsyncClient() as client:
            adapters = {
                EngineKind.VLLM: VllmEngine(client),
                EngineKind.SGLANG: SglangEngine(client),
                EngineKind.LLAMACPP: LlamaCppEngine(client),
                EngineKind.OPENAI: OpenAICompatibleEngine(client),
            }
            return await EngineDispatcher(adapters).cache_stats(box)

    daemon = asyncio.run(scrape())
    assert (daemon.queried_tokens, daemon.hit_tokens) == (window["queried_tokens"], window["hit_tokens"])
    assert cumulative_hit_rate(daemon).hit_rate == pytest.approx(window["hit_rate"])


def test_prometheus_text_labels_escapes_and_special_values() -> None:
    text = (
        'a_total{path="/v1/x",msg="say \\"hi\\"\\n",b="c,d"} 3 1700000000000\n'
        "b_gauge +Inf\n"
        "c_gauge NaN\n"
        "d{} 1e3\n"
    )
    samples = parse_prometheus_text(text)
    assert samples[0].labels == (("b", "c,d"), ("msg", 'say "hi"\n'), ("path", "/v1/x"))
    assert samples[0].value == 3.0
    assert samples[1].value == math.inf
    assert math.isnan(samples[2].value)
    assert samples[3].value == 1000.0


@pytest.mark.parametrize(
    ("text", "line_no"),
    [("ok 1\nbad{x=1} 2\n", 2), ('x{a="1" 2\n', 1), ("x one\n", 1), ('{a="b"} 1\n', 1), ("x 1 2 3\n", 1)],
)
def test_prometheus_text_errors_name_the_line(text: str, line_no: int) -> None:
    with pytest.raises(MetricsTextError) as caught:
        parse_prometheus_text(text)
    assert caught.value.line_no == line_no


# ------------------------------------------------------------------------------------------ windows


def test_hit_rate_between_two_scrapes() -> None:
    window = hit_rate_between(CacheStats(4000, 3200), CacheStats(6000, 5100))
    assert (window.queried_tokens, window.hit_tokens) == (2000, 1900)
    assert window.hit_rate == pytest.approx(0.95)
    assert not window.counters_reset


def test_counters_going_backwards_mean_a_restart() -> None:
    window = hit_rate_between(CacheStats(4000, 3200), CacheStats(1000, 500))
    assert window.counters_reset
    assert (window.queried_tokens, window.hit_tokens, window.hit_rate) == (1000, 500, 0.5)


def test_no_traffic_between_scrapes_is_no_data() -> None:
    window = hit_rate_between(CacheStats(4000, 3200), CacheStats(4000, 3200))
    assert window.hit_rate is None
    assert check_hit_rate(window).status is HitRateStatus.NO_DATA


def test_threshold_check() -> None:
    ok = check_hit_rate(hit_rate_between(CacheStats(0, 0), CacheStats(1000, 910)))
    low = check_hit_rate(hit_rate_between(CacheStats(0, 0), CacheStats(1000, 899)))
    assert (ok.status, ok.alert, ok.threshold) == (HitRateStatus.OK, False, 0.9)
    assert (low.status, low.alert) == (HitRateStatus.BELOW_THRESHOLD, True)
    quiet = check_hit_rate(hit_rate_between(CacheStats(0, 0), CacheStats(10, 1)), min_queried_tokens=1000)
    assert quiet.status is HitRateStatus.NO_DATA
    with pytest.raises(ValueError, match="threshold"):
        check_hit_rate(cumulative_hit_rate(CacheStats(1, 1)), threshold=1.5)


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_on_the_sample_log_prints_the_hand_figure() -> None:
    result = CliRunner().invoke(hitrate, ["--sglang-log", str(SAMPLE_LOG)])
    assert result.exit_code == 0, result.output
    assert f"cached share: {HAND_SHARE:.1%}" in result.output
    assert "38,464 cached of 116,277 prompt tokens" in result.output
    assert "SPIKE: 8 of 16 prefills (50%) reused exactly 1,024 tokens" in result.output
    assert "below the 90% threshold" in result.output


def test_cli_json_and_min_tokens() -> None:
    result = CliRunner().invoke(hitrate, ["--sglang-log", str(SAMPLE_LOG), "--json"])
    data = json.loads(result.output)
    assert data["cached_share"] == pytest.approx(HAND_SHARE)
    assert (data["new_tokens"], data["cached_tokens"]) == (HAND_NEW, HAND_CACHED)
    assert data["spike"]["cached_tokens"] == 1024
    assert data["check"]["status"] == "below_threshold"
    everything = json.loads(
        CliRunner().invoke(hitrate, ["--sglang-log", str(SAMPLE_LOG), "--json", "--min-tokens", "0"]).output
    )
    assert everything["counted_prefills"] == 25
    assert everything["cached_share"] == pytest.approx(field_report_share(SAMPLE_LOG, 0))


def test_cli_fail_below_sets_the_exit_status() -> None:
    result = CliRunner().invoke(hitrate, ["--sglang-log", str(SAMPLE_LOG), "--fail-below"])
    assert result.exit_code == Exit.FAILED
    passing = CliRunner().invoke(
        hitrate, ["--sglang-log", str(SAMPLE_LOG), "--fail-below", "--threshold", "0.3"]
    )
    assert passing.exit_code == 0


def test_cli_needs_exactly_one_source() -> None:
    assert CliRunner().invoke(hitrate, []).exit_code == 2
    both = CliRunner().invoke(hitrate, ["--sglang-log", str(SAMPLE_LOG), "--metrics-url", "http://x/metrics"])
    assert both.exit_code == 2


class _MetricsPages:
    """Serves a sequence of /metrics bodies on loopback, one per GET (the last one repeats)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.pages[min(outer.hits, len(outer.pages) - 1)].encode()
                outer.hits += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"


MetricsPagesFactory = Callable[[list[str]], _MetricsPages]


@pytest.fixture
def metrics_pages() -> Iterator[MetricsPagesFactory]:
    started: list[_MetricsPages] = []

    def start(pages: list[str]) -> _MetricsPages:
        server = _MetricsPages(pages)
        threading.Thread(target=server.server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.server.shutdown()
        server.server.server_close()


def test_cli_metrics_url_one_scrape_is_cumulative(metrics_pages: MetricsPagesFactory) -> None:
    server = metrics_pages([LLAMACPP_METRICS])
    result = CliRunner().invoke(hitrate, ["--metrics-url", server.url, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["engine"] == "llamacpp"
    assert data["window"]["hit_rate"] == pytest.approx(6000 / 7200)
    assert data["span"] == "cumulative"


def test_cli_metrics_url_interval_reports_the_traffic_between(metrics_pages: MetricsPagesFactory) -> None:
    later = VLLM_METRICS.replace("3000.0", "5000.0").replace("2560.0", "4460.0")
    server = metrics_pages([VLLM_METRICS, later])
    result = CliRunner().invoke(hitrate, ["--metrics-url", server.url, "--interval", "0.05"])
    assert result.exit_code == 0, result.output
    assert "vllm" in result.output
    assert "hit rate over 0.05s: 95.0%" in result.output
    assert "1,900 cached of 2,000 prompt tokens" in result.output
    assert server.hits == 2
