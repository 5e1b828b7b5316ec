"""`warmer serve`: run the daemon until SIGTERM/SIGINT."""

from __future__ import annotations

import click

from warmer.cli.group import CliState, pass_state


@click.command("serve")
@pass_state
def serve(state: CliState) -> None:
    """Run the daemon: the HTTP API (/healthz, /readyz, /metrics, OpenAPI at /docs) and its root tasks.

    Migrates the embedded SQLite database by itself; a server database must already be at the newest
    schema (`warmer db upgrade`). Stops gracefully on SIGTERM/SIGINT within reconcile.shutdown_grace_seconds
    (a second signal stops at once). Exits non-zero when the config is invalid or a root task fails.
    """
    # Imported here, not at module level: `warmer --help` and `check-config` stay fast.
    from warmer.root.app import build
    from warmer.root.logging import configure_logging
    from warmer.root.server import run_daemon_loop

    loaded = state.load_config()
    settings = loaded.settings
    configure_logging(
        settings.logging.level, settings.logging.format, library_level=settings.logging.libraries
    )
    daemon = build(settings, profiles=loaded.profiles, agents=loaded.agents)
    raise SystemExit(run_daemon_loop(daemon.run(freeze_heap=True), settings.api.event_loop))
