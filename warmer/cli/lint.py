"""`warmer lint [AGENT...]`: how much of each agent's turn-1 prompt the cache can reuse, and what breaks it.

Exit codes: 0 ok, 1 an agent has an error-level finding (unless `--report-only`) or is below `--min-share`,
2 configuration error (so CI can tell them apart). `--format sarif|github` prints SARIF 2.1.0 for code
scanning or GitHub Actions annotations, each pointing at the spec file line to change.
It also reports tokenizer drift when the configured database (never created or migrated here) holds
an earlier token count of the same prefix text that differs materially from today's.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Mapping
from pathlib import Path

import click

from warmer import __version__
from warmer.adapters.store import read_prefix_token_history
from warmer.cli.exits import Exit
from warmer.cli.prompts import (
    PROMPT_TOOLS_KEY,
    config_options,
    fail_config,
    load_with_settings,
    profile_of,
    tools_for,
)
from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_engine_version
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError, StoreUnavailable
from warmer.core.lint import AgentLint, Finding, SpecPlace, lint_agent, shared_prefixes
from warmer.core.lint_report import LocatedFinding, github_annotations, locate_finding, sarif_log
from warmer.core.model import ModelProfile, prefix_hash
from warmer.core.prefix import StablePrefix, compute_stable_prefix
from warmer.core.tokenizer_drift import TokenCountObservation, detect_tokenizer_drift

# Engine version lint records for its own count when the prompt tools are injected (not the offline
# profile files): drift is then judged against the newest recorded count of any version.
INJECTED_TOOLS_VERSION = "lint:injected-tools"
HISTORY_CONNECT_TIMEOUT_SECONDS = 3.0


def _count_observation(
    ctx: click.Context, stable: StablePrefix, profile: ModelProfile
) -> TokenCountObservation:
    """Today's count of the prefix, labelled as the daemon labels it (offline: the tokenizer file digest),
    so history recorded by the same tokenizer is not mistaken for an earlier version."""
    offline = PROMPT_TOOLS_KEY not in ctx.meta
    version = offline_engine_version(profile) if offline else INJECTED_TOOLS_VERSION
    return TokenCountObservation(
        prefix_hash(stable.text), stable.model or profile.name, version, stable.token_count
    )


def _with_drift_findings(
    settings: Settings | None, results: list[AgentLint], counts: list[TokenCountObservation]
) -> tuple[list[AgentLint], str | None]:
    """Add a tokenizer-drift finding to each agent whose prefix text the configured database recorded with
    a materially different count. Returns the results and, when the history could not be read, why."""
    if settings is None:
        return results, None
    try:
        history = read_prefix_token_history(
            settings.database_url(),
            [(count.model, count.text_hash) for count in counts],
            connect_timeout_seconds=HISTORY_CONNECT_TIMEOUT_SECONDS,
        )
    except StoreUnavailable as exc:
        # The embedded file not existing yet is the normal state before the daemon first ran: no note.
        return results, None if settings.database.is_embedded else str(exc)
    out = []
    for result, count in zip(results, counts, strict=True):
        drift = detect_tokenizer_drift(history.get((count.model, count.text_hash), []), count)
        out.append(
            result if drift is None else dataclasses.replace(result, findings=(*result.findings, drift))
        )
    return out, None


def _finding_line(finding: Finding) -> str:
    line = f"  [{finding.severity}] {finding.code}: {finding.message}"
    return line + (f"\n      -> {finding.advice}" if finding.advice else "")


def _read_spec_file(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _repo_path(path: str) -> str:
    """A spec path relative to the working directory (the repository root in CI), else absolute."""
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def _repo_uri(path: str) -> str:
    """SARIF artifact URI: repository-relative when under the working directory, else a file URI."""
    relative = _repo_path(path)
    return relative if not relative.startswith("/") else Path(relative).as_uri()


def _located(
    results: list[AgentLint], specs: Mapping[str, AgentSpec], below: list[AgentLint], min_share: float | None
) -> list[LocatedFinding]:
    """Every finding with the spec file lines it points at; an agent below --min-share is one more."""
    items: list[LocatedFinding] = []
    for result in results:
        spec = specs[result.agent]
        findings = list(result.findings)
        if result in below and min_share is not None:
            findings.append(
                Finding(
                    code="below-min-share",
                    severity="error",
                    message=f"stable share {result.stable_share:.1%} < --min-share {min_share:.1%}",
                    location="the spec",
                    places=(SpecPlace("spec"),),
                )
            )
        items += [locate_finding(spec, f, _read_spec_file) for f in findings]
    return items


def _echo_text(results: list[AgentLint], shared: Mapping[str, list[str]]) -> None:
    for result in results:
        click.echo(
            f"{result.agent} ({result.model}): {result.stable_prefix_tokens} stable tokens of "
            f"{result.turn1_prompt_tokens} ({result.stable_share:.1%}; ideal {result.ideal_share:.1%}); "
            f"first per-call value at token {result.first_dynamic_token_offset}"
            + (f" in {result.first_dynamic_location}" if result.first_dynamic_location else "")
            + (
                f"; wastes {result.wasted_tokens_per_call} tokens per call"
                if result.wasted_tokens_per_call
                else ""
            )
        )
        others = [a for a in shared.get(result.prefix_hash, []) if a != result.agent]
        if others:
            click.echo(f"  [info] shares its prefix (one cache entry) with: {', '.join(others)}")
        for finding in result.findings:
            click.echo(_finding_line(finding))


@click.command("lint")
@click.argument("agent_ids", nargs=-1, metavar="[AGENT...]")
@config_options
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json", "sarif", "github"]),
    default=None,
    help="text (default); json: one object per agent; sarif: SARIF 2.1.0 for code scanning; "
    "github: GitHub Actions annotations.",
)
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option(
    "--min-share",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Exit 1 when any agent's stable share of its turn-1 prompt is below this (for prompt CI).",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Exit 0 despite error-level findings (--min-share still fails the run when given).",
)
@click.pass_context
def lint_command(
    ctx: click.Context,
    agent_ids: tuple[str, ...],
    config_path: Path | None,
    agents_dir: Path | None,
    models_dir: Path | None,
    samples: int,
    output_format: str | None,
    as_json: bool,
    min_share: float | None,
    report_only: bool,
) -> None:
    """Per agent: stable-prefix tokens, share of turn 1, where the first per-call value sits, advice.

    Exits 1 when any agent has an error-level finding (unless --report-only) or is below --min-share.
    """
    if as_json and output_format not in (None, "json"):
        raise click.UsageError(f"--json and --format {output_format} disagree: give one of them")
    fmt = "json" if as_json else output_format or "text"
    results: list[AgentLint] = []
    stables: list[StablePrefix] = []
    counts: list[TokenCountObservation] = []
    try:
        agents, profiles, settings = load_with_settings(ctx, config_path, agents_dir, models_dir)
        unknown = [a for a in agent_ids if a not in agents]
        if unknown:
            raise ConfigError(
                [("agent", f"unknown agent(s) {', '.join(unknown)} (known: {', '.join(sorted(agents))})")]
            )
        for agent_id in agent_ids or tuple(sorted(agents)):
            spec = agents[agent_id]
            profile = profile_of(spec, profiles)
            render, tokenize = tools_for(ctx, profile)
            stable = compute_stable_prefix(spec, render, tokenize, samples=samples)
            stables.append(stable)
            results.append(
                lint_agent(spec, render, tokenize, samples=samples, stable=stable, provider=profile.provider)
            )
            counts.append(_count_observation(ctx, stable, profile))
    except ConfigError as exc:
        fail_config(exc)
        return
    results, history_problem = _with_drift_findings(settings, results, counts)
    if history_problem is not None:
        click.echo(f"note: tokenizer drift not checked: {history_problem}", err=True)
    shared = shared_prefixes(stables)
    below = [r for r in results if min_share is not None and r.stable_share < min_share]
    failing = [] if report_only else [r for r in results if r.errors]

    if fmt == "json":
        payload = []
        for result in results:
            data = result.as_json()
            data["shares_prefix_with"] = [a for a in shared.get(result.prefix_hash, []) if a != result.agent]
            data["below_min_share"] = result in below
            payload.append(data)
        click.echo(json.dumps(payload, ensure_ascii=False, indent=2))
    elif fmt == "sarif":
        log = sarif_log(
            _located(results, agents, below, min_share), tool_version=__version__, uri_of=_repo_uri
        )
        click.echo(json.dumps(log, ensure_ascii=False, indent=2))
    elif fmt == "github":
        for line in github_annotations(_located(results, agents, below, min_share), path_of=_repo_path):
            click.echo(line)
    else:
        _echo_text(results, shared)
        for result in below:
            click.echo(
                f"FAIL {result.agent}: stable share {result.stable_share:.1%} < --min-share {min_share:.1%}"
            )
        for result in failing:
            click.echo(
                f"FAIL {result.agent}: {len(result.errors)} error-level finding(s) "
                "(--report-only reports without failing)"
            )
    if below:
        sys.exit(Exit.FAILED)
    if failing:
        sys.exit(Exit.FAILED)  # like every linter (--report-only opts out)
