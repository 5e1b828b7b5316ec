"""`warmer hitrate`: the cached share of prompt processing, from an SGLang log, an engine's /metrics, or
per-call usage records (`--calls`, `warmer.cli.calls`)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import click
import httpx

from warmer.cli.calls import print_call_report, read_call_records
from warmer.cli.chart import write_chart
from warmer.cli.exits import Exit, fail
from warmer.cli.prompts import fail_config, profile_of, tools_for
from warmer.config.loader import load_config
from warmer.core.agents import AgentSpec
from warmer.core.call_report import (
    DEFAULT_COVERAGE_OK,
    DEFAULT_DEPTH_OK,
    DEFAULT_TURN_BUCKETS,
    CallUsageOptions,
    analyze_call_usage,
    call_usage_json,
)
from warmer.core.call_usage import RecordFields
from warmer.core.errors import ConfigError
from warmer.core.hitrate import (
    DEFAULT_HIT_RATE_THRESHOLD,
    DEFAULT_MIN_PREFILL_TOKENS,
    HitRateSource,
    HitRateWindow,
    SglangLogReport,
    analyze_sglang_log,
    cache_stats_from_samples,
    check_hit_rate,
    cumulative_hit_rate,
    detect_engine,
    hit_rate_between,
)
from warmer.core.model import CacheStats, EngineKind
from warmer.core.prefix import compute_stable_prefix
from warmer.core.promtext import MetricsTextError, parse_prometheus_text
from warmer.root.http import sync_http_client


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _log_report_dict(report: SglangLogReport, threshold: float) -> dict[str, object]:
    data = asdict(report)
    data["prompt_tokens"] = report.prompt_tokens
    data["cached_share"] = report.cached_share
    window = HitRateWindow(
        report.cached_share, report.prompt_tokens, report.cached_tokens, HitRateSource.COUNTERS
    )
    data["check"] = asdict(check_hit_rate(window, threshold=threshold))
    return data


def _print_log_report(path: Path, report: SglangLogReport, threshold: float) -> None:
    echo = click.echo
    echo(f"SGLang log: {path}")
    echo(
        f"prefill lines: {report.prefill_lines}; counted {report.counted_prefills}, "
        f"ignored {report.ignored_small_prefills} below {report.min_tokens:,} tokens"
    )
    echo(
        f"cached share: {_pct(report.cached_share)} "
        f"({report.cached_tokens:,} cached of {report.prompt_tokens:,} prompt tokens)"
    )
    if report.cached_share is not None and report.cached_share < threshold:
        echo(f"below the {threshold:.0%} threshold")
    echo(f"prefills with no cached tokens: {report.zero_hit_prefills}")
    if report.multi_seq_batches:
        echo(f"batches with several new requests (tokens summed per batch): {report.multi_seq_batches}")
    if report.top_values:
        echo("most common cached tokens per prefill:")
        width = max(len(f"{v.cached_tokens:,}") for v in report.top_values)
        for value in report.top_values:
            bar = "#" * max(1, round(value.share * 40))
            echo(f"  {value.cached_tokens:>{width},}  x{value.count:<5} {value.share:6.1%}  {bar}")
    if report.buckets:
        echo("distribution (cached tokens per prefill):")
        for bucket in report.buckets:
            label = "0" if bucket.high == 1 else f"[{bucket.low:,}, {bucket.high:,})"
            echo(f"  {label:>20}  {bucket.count}")
    spike = report.spike
    if spike is not None:
        message = (
            f"{spike.count} of {report.counted_prefills} prefills ({spike.share:.0%}) reused exactly "
            f"{spike.cached_tokens:,} tokens of ~{spike.median_prompt_tokens:,.0f}-token prompts "
            f"({spike.cached_fraction_of_prompt:.0%})"
        )
        if spike.suspicious:
            echo(
                f"SPIKE: {message}: the cached run stops at the same token every time; "
                f"the first per-call value probably sits just after token {spike.cached_tokens:,}."
            )
        else:
            echo(f"dominant value: {message}: the stable prefix.")


def _scrape(client: httpx.Client, url: str, engine: EngineKind | None) -> tuple[EngineKind, CacheStats]:
    try:
        response = client.get(url)
    except httpx.HTTPError as exc:
        fail(Exit.UNAVAILABLE, f"Error: {url}: {type(exc).__name__}: {exc}")
    if response.status_code != 200:
        raise click.ClickException(f"{url}: HTTP {response.status_code} (llama-server needs --metrics)")
    try:
        samples = parse_prometheus_text(response.text)
    except MetricsTextError as exc:
        raise click.ClickException(f"{url}: {exc}") from exc
    kind = engine or detect_engine(samples)
    if kind is None:
        raise click.ClickException(f"{url}: no vllm:, sglang: or llamacpp: metrics; pass --engine")
    return kind, cache_stats_from_samples(kind, samples)


def _stable_shares(ctx: click.Context, agents_in_log: set[str]) -> dict[str, float]:
    """warmer's own stable-prefix share of a turn-1 prompt, per agent of the log that the config (the group's
    --config or WARMER_CONFIG) knows, computed offline as `warmer lint` does; none without a config."""
    config_path = getattr(ctx.find_root().obj, "config_path", None)
    if not isinstance(config_path, Path):
        return {}
    shares: dict[str, float] = {}
    try:
        loaded = load_config(config_path)
        for agent_id in sorted(agents_in_log):
            spec = loaded.agents.get(agent_id)
            if not isinstance(spec, AgentSpec):
                continue
            render, tokenize = tools_for(ctx, profile_of(spec, loaded.profiles))
            shares[agent_id] = compute_stable_prefix(spec, render, tokenize).stable_share
    except ConfigError as exc:
        fail_config(exc)
    return shares


def _report_calls(
    ctx: click.Context,
    path: Path,
    *,
    fields: RecordFields,
    fmt: str,
    options: CallUsageOptions,
    chart: Path | None,
    as_json: bool,
) -> float | None:
    """`--calls`: print the report (or its JSON), draw the chart when asked; the turn-1 hit rate."""
    records = read_call_records(path, fields, None if fmt == "auto" else fmt)
    report = analyze_call_usage(
        records, stable_shares=_stable_shares(ctx, {r.agent for r in records if r.agent}), options=options
    )
    if chart is not None:
        write_chart(chart, report, [r.cached_tokens for r in records if r.turn == 1])
    if as_json:
        click.echo(json.dumps(call_usage_json(report), indent=2))
    else:
        print_call_report(path, report, fields.group)
        if chart is not None:
            click.echo(f"chart: {chart}")
    return report.turn1.hit_rate


_CALLS_HELP = (
    "Per-call usage records, JSON lines or CSV: call id, turn index (1 = first), a grouping column, and the "
    "usage as the API answered it (OpenAI Chat Completions / Responses, Anthropic Messages, an engine's "
    "OpenAI-compatible answer)."
)


@click.command("hitrate")
@click.option(
    "--sglang-log",
    "log_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="SGLang server log: reads its `Prefill batch ... #new-token: N, #cached-token: M` lines.",
)
@click.option(
    "--calls",
    "calls_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=_CALLS_HELP,
)
@click.option(
    "--min-tokens",
    type=click.IntRange(min=0),
    default=DEFAULT_MIN_PREFILL_TOKENS,
    show_default=True,
    help="Ignore prefills with fewer prompt tokens (new + cached): health checks and pings.",
)
@click.option(
    "--top", type=click.IntRange(min=0), default=10, show_default=True, help="Cached values to list."
)
@click.option("--metrics-url", help="An engine's /metrics URL (vLLM, SGLang, llama-server --metrics).")
@click.option(
    "--engine",
    type=click.Choice([EngineKind.VLLM.value, EngineKind.SGLANG.value, EngineKind.LLAMACPP.value]),
    help="Engine behind --metrics-url (default: detected from the metric names).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0, min_open=True),
    help="Scrape twice, this many seconds apart, and report the hit rate of the traffic in between.",
)
@click.option(
    "--threshold",
    type=click.FloatRange(0, 1),
    default=DEFAULT_HIT_RATE_THRESHOLD,
    show_default=True,
    help="Hit rate below which the result is flagged (with --calls: the turn-1 hit rate).",
)
@click.option("--fail-below", is_flag=True, help="Exit with status 1 when the hit rate is below --threshold.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--calls-format",
    type=click.Choice(["auto", "jsonl", "csv"]),
    default="auto",
    show_default=True,
    help="--calls file format (auto: csv for a .csv file, else JSON lines).",
)
@click.option("--call-field", "call", default="call_id", show_default=True, help="Call id field (dotted).")
@click.option("--turn-field", "turn", default="turn", show_default=True, help="Turn index field, 1-based.")
@click.option(
    "--group-field", "group", default="direction", show_default=True, help="Field to group calls by."
)
@click.option("--agent-field", "agent", default="agent", show_default=True, help="Agent id field.")
@click.option("--box-field", "box", default="box", show_default=True, help="Box (engine endpoint) field.")
@click.option(
    "--usage-field",
    "usage",
    default="usage",
    show_default=True,
    help="The usage object's field; records without it carry the usage keys at their top level.",
)
@click.option(
    "--turn-buckets",
    type=click.IntRange(min=1, max=100),
    default=DEFAULT_TURN_BUCKETS,
    show_default=True,
    help="Turn rows to show; the last one is N+.",
)
@click.option(
    "--depth-ok",
    type=click.FloatRange(0, 1),
    default=DEFAULT_DEPTH_OK,
    show_default=True,
    help="Stable-prefix share of a turn-1 prompt below which an agent has a depth problem.",
)
@click.option(
    "--coverage-ok",
    type=click.FloatRange(0, 1),
    default=DEFAULT_COVERAGE_OK,
    show_default=True,
    help="Share of turn-1 requests reaching a warm cache below which an agent has a coverage problem.",
)
@click.option(
    "--chart",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --calls: also write a PNG (hit rate by turn index, cached-token histogram); needs the "
    "`charts` extra.",
)
@click.pass_context
def hitrate(
    ctx: click.Context,
    log_path: Path | None,
    calls_path: Path | None,
    min_tokens: int,
    top: int,
    metrics_url: str | None,
    engine: str | None,
    interval: float | None,
    threshold: float,
    fail_below: bool,
    as_json: bool,
    calls_format: str,
    call: str,
    turn: str,
    group: str,
    agent: str,
    box: str,
    usage: str,
    turn_buckets: int,
    depth_ok: float,
    coverage_ok: float,
    chart: Path | None,
) -> None:
    """Cached share of prompt processing, from an SGLang log, an engine's /metrics, or call records.

    With a log, prints the share over prefills of at least --min-tokens tokens and the distribution of
    cached tokens per prefill: a spike at one value far below the prompt length (e.g. exactly 1,024)
    means the prefix breaks there.

    With --calls, prints the turn-1 hit rate; hit rate by turn index, by turns in the call, by
    --group-field and by box; the cached tokens per turn-1 request with each agent's spike; and per agent
    depth (the reusable share of the prompt: warmer's stable prefix when the --config knows the agent,
    else the deepest turn-1 hit) against coverage (the share of turn-1 requests that reached a warm cache).
    """
    if sum(source is not None for source in (log_path, metrics_url, calls_path)) != 1:
        raise click.UsageError("give exactly one of --sglang-log, --metrics-url or --calls")
    if chart is not None and calls_path is None:
        raise click.UsageError("--chart goes with --calls")
    if calls_path is not None:
        rate = _report_calls(
            ctx,
            calls_path,
            fields=RecordFields(call=call, turn=turn, group=group, agent=agent, box=box, usage=usage),
            fmt=calls_format,
            options=CallUsageOptions(
                turn_buckets=turn_buckets, depth_ok=depth_ok, coverage_ok=coverage_ok, top=top
            ),
            chart=chart,
            as_json=as_json,
        )
        below = rate is not None and rate < threshold
    elif log_path is not None:
        with log_path.open(errors="replace") as lines:
            report = analyze_sglang_log(lines, min_tokens=min_tokens, top=top)
        data = _log_report_dict(report, threshold)
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            _print_log_report(log_path, report, threshold)
        below = report.cached_share is not None and report.cached_share < threshold
    else:
        assert metrics_url is not None  # checked above; narrows the type
        kind = EngineKind(engine) if engine else None
        with sync_http_client() as client:
            kind, first = _scrape(client, metrics_url, kind)
            if interval is None:
                window = cumulative_hit_rate(first)
            else:
                time.sleep(interval)
                _, second = _scrape(client, metrics_url, kind)
                window = hit_rate_between(first, second)
        check = check_hit_rate(window, threshold=threshold)
        below = check.alert
        if as_json:
            payload = {"engine": kind.value, "window": asdict(window), "check": asdict(check)}
            payload["span"] = "cumulative" if interval is None else f"{interval:g}s"
            click.echo(json.dumps(payload, indent=2))
        else:
            span = "since the engine started" if interval is None else f"over {interval:g}s"
            click.echo(
                f"{kind.value} {metrics_url}: hit rate {span}: {_pct(window.hit_rate)} ({window.source})"
            )
            if window.queried_tokens is not None and window.hit_tokens is not None:
                click.echo(f"  {window.hit_tokens:,.0f} cached of {window.queried_tokens:,.0f} prompt tokens")
            if window.counters_reset:
                click.echo("  counters went backwards: the engine restarted; counting from its restart")
            if check.alert:
                click.echo(f"  below the {threshold:.0%} threshold")
    if fail_below and below:
        raise SystemExit(Exit.FAILED)
