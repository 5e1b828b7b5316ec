"""`warmer check-config`: validate a whole configuration and list every problem by field path."""

from __future__ import annotations

from pathlib import Path

import click

from warmer.cli.group import CliState, pass_state


@click.command("check-config")
@click.argument("path", required=False, type=click.Path(path_type=Path, dir_okay=False))
@pass_state
def check_config(state: CliState, path: Path | None) -> None:
    """Validate PATH (default: --config / WARMER_CONFIG) with its model profiles and agents.

    Prints each problem as `field.path: message` on stderr and exits 3; prints a short summary and exits 0
    when the configuration is valid. Environment overrides (WARMER_*) are applied, as `serve` would.
    """
    loaded = state.load_config(path)
    settings = loaded.settings
    source = str(loaded.source) if loaded.source is not None else "defaults + environment"
    database = "embedded sqlite" if settings.database.is_embedded else "server database"
    click.echo(
        f"config ok: {source}: {len(loaded.boxes)} boxes, {len(loaded.profiles)} model profiles, "
        f"{len(loaded.agents)} agents, {database}, API on {settings.api.host}:{settings.api.port}"
    )
