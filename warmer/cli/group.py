"""The `warmer` command group and what every subcommand shares (config loading, problem printing).

Subcommands are plain click commands in their own modules, added to `main` in `warmer/cli/__init__.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import click

import warmer
from warmer.cli.exits import Exit
from warmer.config.loader import LoadedConfig, load_config
from warmer.config.settings import CONFIG_ENV_VAR, Settings, load_settings
from warmer.core.errors import ConfigError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@dataclass(frozen=True, slots=True)
class CliState:
    """Options given to the group, available to every subcommand via `@pass_state`."""

    config_path: Path | None

    def load_config(self, path: Path | None = None) -> LoadedConfig:
        """The validated whole config, or exit 3 (Exit.CONFIG) listing every problem by field path."""
        try:
            return load_config(path if path is not None else self.config_path)
        except ConfigError as exc:
            fail_with_problems(exc)

    def load_settings(self) -> Settings:
        """Only the settings tree (enough for database commands), or exit 3 listing the problems."""
        try:
            return load_settings(self.config_path)
        except ConfigError as exc:
            fail_with_problems(exc)


pass_state = click.make_pass_decorator(CliState)


def fail_with_problems(error: ConfigError) -> NoReturn:
    """Print each problem as `path: message` on stderr and exit with `Exit.CONFIG`."""
    for path, message in error.problems:
        click.echo(f"{path}: {message}", err=True)
    count = len(error.problems)
    click.echo(f"config invalid: {count} problem{'s' if count != 1 else ''}", err=True)
    raise SystemExit(Exit.CONFIG)


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(warmer.__version__, "--version", "-V", prog_name="warmer")
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar=CONFIG_ENV_VAR,
    show_envvar=True,
    help="Config file (TOML). WARMER_* environment variables override its values "
    "(nested with __, e.g. WARMER_API__PORT). Without one: defaults plus environment.",
)
@click.pass_context
def main(ctx: click.Context, config_path: Path | None) -> None:
    """warmer keeps LLM prompt prefixes warm in engine KV caches (SGLang, vLLM, llama.cpp) and lets
    traffic reach a box only once it is warm.

    \b
    Start here:
      warmer check-config config/example.toml   validate a config, every problem by field path
      warmer --config config/example.toml serve run the daemon (API, /healthz, /readyz, /metrics)
    """
    ctx.obj = CliState(config_path=config_path)
