"""One exit code per kind of failure, the same in every command (README "Exit codes"), so a script or a
pipeline step can tell "the answer is no" from "you called it wrong", "the config is broken" and "something
it needs did not answer"."""

from __future__ import annotations

import sys
from enum import IntEnum
from typing import NoReturn

import click


class Exit(IntEnum):
    OK = 0
    # The command did its job and the answer is no: lint error findings or a stable share under
    # --min-share, a warm not verified, a hit rate under --fail-below, `serve` stopped by a failing task.
    FAILED = 1
    # The command line is wrong: an unknown option, a missing or bad argument (click's own code).
    USAGE = 2
    # The configuration is invalid: a field, an agent or profile file, or an agent or box named on the
    # command line that the configuration does not have. Every problem is printed with its field path.
    CONFIG = 3
    # Something the command needs did not answer: the daemon (`status`), an engine (`warm`, `hitrate
    # --metrics-url`), the database (`db upgrade`).
    UNAVAILABLE = 4


def fail(code: Exit, message: str) -> NoReturn:
    """Print `message` on stderr and exit with `code`."""
    click.echo(message, err=True)
    sys.exit(code)


class BadInput(click.ClickException):
    """A file named on the command line cannot be read as what the command takes (`Exit.USAGE`)."""

    exit_code = Exit.USAGE


class Unavailable(click.ClickException):
    """Something the command needs is not there or did not answer (`Exit.UNAVAILABLE`)."""

    exit_code = Exit.UNAVAILABLE
