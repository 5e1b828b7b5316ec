"""`warmer hitrate --calls FILE`: per-call usage records (JSON lines or CSV) read, checked and reported.

Thin shell: the records are read by `warmer.core.call_usage`, the figures are `warmer.core.call_report`.
What this module owns is the file: which line a bad field sits on, duplicates, and how the report prints.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from pathlib import Path

import click

from warmer.cli.exits import BadInput
from warmer.core.call_report import CallUsageReport, HitRate
from warmer.core.call_usage import RecordFields, UsageFieldError, UsageRecord, nest_csv_row, read_usage_record


def _fail(path: Path, line: int, message: str) -> click.ClickException:
    return BadInput(f"{path}:{line}: {message}")


def _documents(path: Path, fmt: str) -> Iterator[tuple[int, Mapping[str, object]]]:
    """(line number, record object) for every record of the file."""
    # utf-8-sig: spreadsheet exports often start a CSV with a byte-order mark, which is not part of a header
    encoding = "utf-8-sig" if fmt == "csv" else "utf-8"
    with path.open(encoding=encoding, newline="" if fmt == "csv" else None) as handle:
        if fmt == "csv":
            reader = csv.DictReader(handle)
            for row in reader:
                try:
                    yield reader.line_num, nest_csv_row(row)
                except UsageFieldError as exc:
                    raise _fail(path, reader.line_num, str(exc)) from exc
            return
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                document = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(path, number, f"not JSON: {exc.msg} (column {exc.colno})") from exc
            if not isinstance(document, dict):
                raise _fail(path, number, "a record must be a JSON object")
            yield number, document


def read_call_records(path: Path, fields: RecordFields, fmt: str | None = None) -> list[UsageRecord]:
    """Every record of a JSON-lines or CSV file (by `fmt`, else by its suffix), or a ClickException naming
    the file, the line and the field of the first bad one. One record per call and turn."""
    fmt = fmt or ("csv" if path.suffix.lower() == ".csv" else "jsonl")
    records: list[UsageRecord] = []
    seen: dict[tuple[str, int], int] = {}
    try:
        for number, document in _documents(path, fmt):
            try:
                record = read_usage_record(document, fields)
            except UsageFieldError as exc:
                raise _fail(path, number, str(exc)) from exc
            key = (record.call_id, record.turn)
            if key in seen:
                raise _fail(
                    path,
                    number,
                    f"{fields.turn}: call {record.call_id!r} turn {record.turn} is already recorded at line "
                    f"{seen[key]}",
                )
            seen[key] = number
            records.append(record)
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text ({exc.reason})") from exc
    except csv.Error as exc:
        raise BadInput(f"{path}: {exc}") from exc
    if not records:
        raise BadInput(f"{path}: no records")
    return records


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _rate_rows(title: str, key: str, rows: tuple[HitRate, ...]) -> None:
    click.echo(title)
    header = f"{'calls':>6} {'requests':>9} {'prompt tok':>11} {'cached tok':>11} {'hit rate':>9}"
    click.echo(f"  {key:<10} {header}")
    for row in rows:
        click.echo(
            f"  {row.label or '(none)':<10} {row.calls:>6} {row.requests:>9} {row.prompt_tokens:>11,} "
            f"{row.cached_tokens:>11,} {_pct(row.hit_rate):>9}"
        )


def print_call_report(path: Path, report: CallUsageReport, group_field: str) -> None:
    """The report as text tables: the same figures as the JSON."""
    echo = click.echo
    apis = ", ".join(f"{api} {count}" for api, count in report.apis.items())
    echo(f"call records: {path}: {report.records} requests in {report.calls} calls (usage: {apis})")
    if report.no_cache_detail_records:
        echo(
            f"  {report.no_cache_detail_records} records name no cached count (read as 0): an engine started "
            "without --enable-prompt-tokens-details (vLLM) reports none"
        )
    turn1 = report.turn1
    echo(
        f"turn-1 hit rate: {_pct(turn1.hit_rate)} ({turn1.cached_tokens:,} cached of "
        f"{turn1.prompt_tokens:,} prompt tokens over {turn1.requests} first turns); "
        f"all turns: {_pct(report.all_turns.hit_rate)}"
    )
    _rate_rows("by turn index:", "turn", report.by_turn)
    _rate_rows("by turns in the call (every turn of those calls):", "turns", report.by_turns_in_call)
    echo(f"by {group_field}:")
    echo(f"  {group_field:<10} {'calls':>6} {'turn-1':>9} {'all turns':>10}")
    for group in report.by_group:
        echo(
            f"  {group.group or '(none)':<10} {group.all_turns.calls:>6} {_pct(group.turn1.hit_rate):>9} "
            f"{_pct(group.all_turns.hit_rate):>10}"
        )
    if report.by_box:
        _rate_rows("by box (turn 1):", "box", report.by_box)
    dist = report.distribution
    echo(f"cached tokens per turn-1 request ({dist.requests}; {dist.zero_hit_requests} with none):")
    if dist.top_values:
        width = max(len(f"{v.cached_tokens:,}") for v in dist.top_values)
        for value in dist.top_values:
            bar = "#" * max(1, round(value.share * 40))
            echo(f"  {value.cached_tokens:>{width},}  x{value.count:<5} {value.share:6.1%}  {bar}")
    for spike in dist.spikes:
        echo(("SPIKE: " if spike.suspicious else "dominant: ") + spike.meaning)
    echo(
        f"depth vs coverage per agent (turn-1 hit rate ~ depth x coverage; ok at depth >= "
        f"{report.depth_ok:.0%} and coverage >= {report.coverage_ok:.0%}):"
    )
    echo(f"  {'agent':<22} {'calls':>6} {'turn-1':>8} {'depth':>8} {'from':>7} {'coverage':>9}  problem")
    for agent in report.agents:
        echo(
            f"  {agent.agent or '(none)':<22} {agent.calls:>6} {_pct(agent.turn1_hit_rate):>8} "
            f"{_pct(agent.depth):>8} {agent.depth_source:>7} {_pct(agent.coverage):>9}  {agent.problem}"
        )
    for agent in report.agents:
        if agent.advice:
            echo(f"  {agent.agent or '(none)'}: {agent.advice}")
