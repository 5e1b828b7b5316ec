"""`warmer sign-webhook`: the signature header for a deploy-webhook body, for pipelines and tests."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from warmer.core.webhook import SIGNATURE_HEADER, sign_body

SECRET_ENV_VAR = "WARMER_WEBHOOK_SECRET"  # noqa: S105 - the variable name, not a secret


@click.command("sign-webhook")
@click.argument("body_file", type=click.Path(exists=True, dir_okay=False, allow_dash=True, path_type=Path))
@click.option(
    "--secret-env",
    default=SECRET_ENV_VAR,
    show_default=True,
    help="Environment variable holding the shared secret (kept out of argv and shell history).",
)
@click.option(
    "--also-secret-env",
    multiple=True,
    help="Another variable whose secret also signs (adds a second v1=, for rotating secrets).",
)
@click.option("--timestamp", type=click.IntRange(min=0), help="Unix seconds to sign with (default: now).")
@click.option("--value-only", is_flag=True, help="Print only the header value, not `Name: value`.")
def sign_webhook(
    body_file: Path,
    secret_env: str,
    also_secret_env: tuple[str, ...],
    timestamp: int | None,
    value_only: bool,
) -> None:
    """Print the X-Warmer-Signature header for BODY_FILE (`-` reads stdin), signed exactly as sent.

    The signature covers the raw bytes of the file and the timestamp: send the file unchanged, e.g.
    `curl --data-binary @event.json -H "$(warmer sign-webhook event.json)" ...`.
    """
    secrets: list[str] = []
    for name in (secret_env, *also_secret_env):
        value = os.environ.get(name, "")
        if not value:
            raise click.UsageError(f"environment variable {name} is empty or unset")
        secrets.append(value)
    body = sys.stdin.buffer.read() if str(body_file) == "-" else body_file.read_bytes()
    value = sign_body(body, secrets, int(time.time()) if timestamp is None else timestamp)
    click.echo(value if value_only else f"{SIGNATURE_HEADER}: {value}")
