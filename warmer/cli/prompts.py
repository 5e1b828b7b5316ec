"""`warmer render AGENT`: the exact stable prefix; and what `warmer lint` (`warmer.cli.lint`) shares with it.

Thin shell: loading is `warmer.config`, computing is `warmer.core.prefix` / `warmer.core.lint`.
Rendering and tokenizing are offline by default (the model profile's chat template + tokenizer file).
Seam for engine-backed rendering: put a `PromptToolsFactory` under `ctx.meta[PROMPT_TOOLS_KEY]` (e.g. one
that calls a box's `/apply-template` + `/tokenize`); both commands then use it instead.
Exit code 2 on a configuration error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import click

from warmer.cli.exits import Exit
from warmer.config.agents import load_agent_specs
from warmer.config.loader import load_config
from warmer.config.profiles import load_profile_set
from warmer.config.settings import Settings
from warmer.config.tokenizer import offline_renderer, offline_tokenizer
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError
from warmer.core.model import ModelProfile
from warmer.core.prefix import RenderFn, StablePrefix, TokenizeFn, compute_stable_prefix

PromptToolsFactory = Callable[[ModelProfile], tuple[RenderFn, TokenizeFn]]

PROMPT_TOOLS_KEY = "warmer.prompt_tools"


def offline_prompt_tools(profile: ModelProfile) -> tuple[RenderFn, TokenizeFn]:
    return offline_renderer(profile), offline_tokenizer(profile)


def config_options(command: Callable[..., None]) -> Callable[..., None]:
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            help="Config file (else WARMER_CONFIG); agents come from its fleet.agents_dir.",
        ),
        click.option(
            "--agents-dir",
            type=click.Path(path_type=Path, file_okay=False),
            default=None,
            help="Agent spec directory; overrides the config's fleet.agents_dir.",
        ),
        click.option(
            "--models-dir",
            type=click.Path(path_type=Path, file_okay=False),
            default=None,
            help="Extra model profile directory on top of the shipped profiles (with --agents-dir).",
        ),
        click.option(
            "--samples",
            type=click.IntRange(min=2),
            default=3,
            show_default=True,
            help="Sample calls rendered to find the common token prefix.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _load(
    ctx: click.Context, config_path: Path | None, agents_dir: Path | None, models_dir: Path | None
) -> tuple[Mapping[str, AgentSpec], Mapping[str, ModelProfile]]:
    agents, profiles, _settings = load_with_settings(ctx, config_path, agents_dir, models_dir)
    return agents, profiles


def load_with_settings(
    ctx: click.Context, config_path: Path | None, agents_dir: Path | None, models_dir: Path | None
) -> tuple[Mapping[str, AgentSpec], Mapping[str, ModelProfile], Settings | None]:
    """Agents and profiles, plus the settings when they came from a config file (None with --agents-dir)."""
    if config_path is None:  # the `warmer --config` group option (or WARMER_CONFIG), when run under it
        group_path = getattr(ctx.find_root().obj, "config_path", None)
        config_path = group_path if isinstance(group_path, Path) else None
    if agents_dir is not None:
        return load_agent_specs(agents_dir), load_profile_set(models_dir), None
    loaded = load_config(config_path)
    if loaded.settings.fleet.agents_dir is None:
        raise ConfigError([("fleet.agents_dir", "no agents configured: set it or pass --agents-dir")])
    agents = {name: spec for name, spec in loaded.agents.items() if isinstance(spec, AgentSpec)}
    return agents, loaded.profiles, loaded.settings


def tools_for(ctx: click.Context, profile: ModelProfile) -> tuple[RenderFn, TokenizeFn]:
    factory: PromptToolsFactory = ctx.meta.get(PROMPT_TOOLS_KEY, offline_prompt_tools)
    return factory(profile)


def profile_of(spec: AgentSpec, profiles: Mapping[str, ModelProfile]) -> ModelProfile:
    profile = profiles.get(spec.model)
    if profile is None:
        known = ", ".join(sorted(profiles)) or "none"
        raise ConfigError(
            [(f"agents.{spec.id}.model", f"unknown model profile {spec.model!r} (known: {known})")]
        )
    return profile


def fail_config(exc: ConfigError) -> None:
    click.echo("configuration error:", err=True)
    for path, message in exc.problems:
        click.echo(f"  {path}: {message}", err=True)
    sys.exit(Exit.CONFIG)


def render_json(spec: AgentSpec, stable: StablePrefix) -> dict[str, object]:
    """What `render --format json` prints: the prefix a warm request sends, and how it was derived."""
    return {
        "agent": spec.id,
        "model": spec.model,
        "spec_hash": spec.spec_hash,
        "prefix_hash": stable.hash,
        "token_count": stable.token_count,
        "turn1_prompt_tokens": stable.turn1_prompt_tokens,
        "stable_share": round(stable.stable_share, 4),
        "first_dynamic_token_offset": stable.first_dynamic_token_offset,
        "first_dynamic_location": stable.first_dynamic_site.describe() if stable.first_dynamic_site else None,
        "text": stable.text,
        "token_ids": list(stable.token_ids),
    }


@click.command("render")
@click.argument("agent")
@config_options
@click.option(
    "--format", "output_format", type=click.Choice(["json", "text"]), default="text", show_default=True
)
@click.pass_context
def render_command(
    ctx: click.Context,
    agent: str,
    config_path: Path | None,
    agents_dir: Path | None,
    models_dir: Path | None,
    samples: int,
    output_format: str,
) -> None:
    """Print AGENT's exact stable prefix: what its warm request sends (text, token ids, count, hash)."""
    try:
        agents, profiles = _load(ctx, config_path, agents_dir, models_dir)
        spec = agents.get(agent)
        if spec is None:
            raise ConfigError(
                [("agent", f"unknown agent {agent!r} (known: {', '.join(sorted(agents)) or 'none'})")]
            )
        render, tokenize = tools_for(ctx, profile_of(spec, profiles))
        stable = compute_stable_prefix(spec, render, tokenize, samples=samples)
    except ConfigError as exc:
        fail_config(exc)
        return
    if output_format == "json":
        click.echo(json.dumps(render_json(spec, stable), ensure_ascii=False, indent=2))
        return
    click.echo(f"# agent {spec.id}  model {spec.model}  prefix {stable.hash}")
    click.echo(
        f"# {stable.token_count} stable tokens of {stable.turn1_prompt_tokens} "
        f"({stable.stable_share:.1%}); first per-call value at token {stable.first_dynamic_token_offset}"
        + (f" ({stable.first_dynamic_site.describe()})" if stable.first_dynamic_site else "")
    )
    click.echo("# --- prefix text (exact, up to the stable boundary) ---")
    click.echo(stable.text, nl=False)
    click.echo("")
