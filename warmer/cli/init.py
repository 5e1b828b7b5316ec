"""`warmer init [DIR]`: a starter configuration for a fresh install, valid as written.

A wheel-installed warmer has no repository next to it, so a new user needs a config to start from: this
writes `warmer.toml` (embedded database, loopback API, boxes of one shipped model profile) and an example
agent whose static text lives in a nested file, the layout real prompt repositories use.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from pydantic import ValidationError

from warmer.config.fleet_settings import BoxSettings
from warmer.config.profiles import load_profile_set
from warmer.core.errors import ConfigError

CONFIG_FILE = "warmer.toml"
DEFAULT_MODEL = "tiny-demo"
DEFAULT_BOX_URL = "http://127.0.0.1:8080"  # llama-server's own default port

_CONFIG_HEAD = """\
# warmer configuration written by `warmer init`. Every value can be overridden by an environment
# variable WARMER_<SECTION>__<KEY> (e.g. WARMER_API__PORT=9000); the environment wins. Relative paths
# resolve against this file's directory. All settings: `warmer check-config --help` and the README.
#
#   warmer --config {config} check-config
#   warmer --config {config} serve

[database]
# Empty url = an embedded SQLite file <state_dir>/warmer.db that `warmer serve` migrates itself.
# Several replicas need PostgreSQL: WARMER_DATABASE__URL=postgresql+psycopg://user:pw@host/db
url = ""
state_dir = "state"

[api]
# Loopback needs no bearer tokens. Binding a routable address needs WARMER_API__TOKENS='["<token>"]';
# deploy webhooks are refused until WARMER_API__WEBHOOK_SECRET is set.
host = "127.0.0.1"
port = {port}

[logging]
level = "INFO"
format = "auto"     # console on a terminal, JSON otherwise

[fleet]
agents_dir = "agents"
# models_dir = "models"   # extra model profiles (<name>.toml) on top of the shipped ones
"""

_BOX = """
[[fleet.boxes]]
id = {id}
base_url = {url}
engine = {engine}
model = {model}
"""

EXAMPLE_AGENT = "example"

_AGENT_SPEC = """\
# An example agent. Everything identical on every call (the persona file, the rules) comes first and is
# kept warm; every per-call value sits in [dynamic], rendered last. Check it: `warmer lint`.
model = {model}

[[blocks]]
name = "persona"
file = "example/persona.md"

[[blocks]]
name = "rules"
text = \"\"\"Keep answers under three sentences.
Confirm the customer's request before acting on it.\"\"\"

[dynamic]
role = "user"
template = \"\"\"Call details
Customer: {{customer_name}}
Local time: {{now}}
The call has just connected. Greet the customer.\"\"\"

[placeholders]
customer_name = "name"
now = "datetime"
"""

_PERSONA = """\
You are Robin, a friendly phone agent for an example company.
You answer calmly and warmly, and you never pressure anyone.
"""


def starter_files(*, model: str, engine: str, box_urls: tuple[str, ...], port: int) -> dict[str, str]:
    """The files `warmer init` writes, by path relative to the target directory."""
    config = _CONFIG_HEAD.format(config=CONFIG_FILE, port=port)
    for index, url in enumerate(box_urls, start=1):
        config += _BOX.format(
            id=json.dumps(f"box-{index}"),
            url=json.dumps(url),
            engine=json.dumps(engine),
            model=json.dumps(model),
        )
    return {
        CONFIG_FILE: config,
        f"agents/{EXAMPLE_AGENT}.toml": _AGENT_SPEC.format(model=json.dumps(model)),
        f"agents/{EXAMPLE_AGENT}/persona.md": _PERSONA,
    }


@click.command("init")
@click.argument("directory", required=False, default=".", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--model",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Shipped model profile of the boxes and the example agent (its engine kind comes with it).",
)
@click.option(
    "--box",
    "box_urls",
    multiple=True,
    metavar="URL",
    help=f"Engine root URL of a box (repeatable). Default: one box at {DEFAULT_BOX_URL}.",
)
@click.option("--port", default=8470, show_default=True, type=click.IntRange(1, 65535), help="API port.")
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def init_command(directory: Path, model: str, box_urls: tuple[str, ...], port: int, force: bool) -> None:
    """Write a starter config (DIRECTORY/warmer.toml, default: here) and an example agent.

    The result passes `warmer check-config` as written; edit the boxes to point at real engines. Existing
    files are left alone (exit 1 naming them) unless --force is given.
    """
    try:
        profiles = load_profile_set()
    except ConfigError as exc:  # a broken install: name the problem rather than write a config
        raise click.ClickException(f"shipped model profiles unreadable: {exc.problems}") from None
    profile = profiles.get(model)
    if profile is None:
        known = ", ".join(sorted(profiles))
        raise click.BadParameter(f"unknown model profile {model!r} (shipped: {known})", param_hint="--model")
    box_urls = box_urls or (DEFAULT_BOX_URL,)
    for url in box_urls:
        try:
            BoxSettings(id="box", base_url=url, engine=profile.engine, model=model)
        except ValidationError as exc:
            message = exc.errors(include_url=False, include_input=False)[0]["msg"]
            raise click.BadParameter(message.removeprefix("Value error, "), param_hint="--box") from None
    files = starter_files(model=model, engine=profile.engine.value, box_urls=box_urls, port=port)
    existing = [name for name in files if (directory / name).exists()]
    if existing and not force:
        raise click.ClickException(
            f"not overwriting {', '.join(str(directory / name) for name in existing)} (use --force)"
        )
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        click.echo(f"wrote {path}")
    config = directory / CONFIG_FILE
    click.echo(f"next: warmer --config {config} check-config && warmer --config {config} serve")
