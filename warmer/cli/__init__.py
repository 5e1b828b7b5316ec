"""The `warmer` command line: a thin shell over the config loader and the composition root.

Each subcommand is a plain click command in its own module; register one with an import line and an
entry in `_COMMANDS` below. Commands needing the group's `--config` use `warmer.cli.group.pass_state`.
"""

import click

from warmer.cli.check import check_config
from warmer.cli.db import db
from warmer.cli.group import main
from warmer.cli.hitrate import hitrate
from warmer.cli.init import init_command
from warmer.cli.lint import lint_command
from warmer.cli.prompts import render_command
from warmer.cli.serve import serve
from warmer.cli.status import status
from warmer.cli.warm import warm_command
from warmer.cli.webhook import sign_webhook

_COMMANDS: tuple[click.Command, ...] = (
    init_command,
    check_config,
    db,
    serve,
    warm_command,
    hitrate,
    sign_webhook,
)
_COMMANDS += (render_command, lint_command, status)

for _command in _COMMANDS:
    main.add_command(_command)

__all__ = ["main"]
