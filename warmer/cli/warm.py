"""`warmer warm`: warm one prefix on one box now and print what the engine reported.

Thin shell: the prefix comes from an agent spec (`warmer.core.prefix`, rendered offline with the model
profile's chat template and tokenizer, as `warmer render` does) or from a file; the request and its
verification are `warmer.service.engine_work.warming.WarmExecutor` over the dispatcher built by
`warmer.root.engines`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from warmer.cli.exits import Exit, fail
from warmer.cli.group import CliState, pass_state
from warmer.cli.prompts import offline_prompt_tools
from warmer.config.loader import LoadedConfig
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError, EngineError, EngineUnavailable, NotSupported
from warmer.core.model import BoxSpec, EngineKind, ModelProfile, Prefix
from warmer.core.prefix import compute_stable_prefix
from warmer.ports import EnginePort
from warmer.root.engines import SystemClock, build_engine_dispatcher, engine_http_client
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome


def _usage(message: str) -> NoReturn:
    fail(Exit.USAGE, f"error: {message}")


def _config_target(
    state: CliState, box_id: str, agent_id: str | None
) -> tuple[LoadedConfig, BoxSpec, ModelProfile]:
    loaded = state.load_config()
    box = next((b for b in loaded.boxes if b.id == box_id), None)
    if box is None:
        known = ", ".join(b.id for b in loaded.boxes) or "none"
        raise ConfigError([("box", f"unknown box {box_id!r} (known: {known})")])
    profile = loaded.profiles[box.model]
    if agent_id is not None:
        spec = loaded.agents.get(agent_id)
        if spec is None:
            known = ", ".join(sorted(loaded.agents)) or "none"
            raise ConfigError([("agent", f"unknown agent {agent_id!r} (known: {known})")])
        if spec.model != box.model:
            raise ConfigError(
                [
                    (
                        "agent",
                        f"agent {agent_id!r} uses model {spec.model!r}, box {box_id!r} serves {box.model!r}",
                    )
                ]
            )
    return loaded, box, profile


async def _prefix_from_file(engine: EnginePort, box: BoxSpec, text: str) -> Prefix:
    """The file's text as the prefix; its size in the engine's own tokens when the engine can tell."""
    try:
        count = len(await engine.tokenize(box, text))
    except NotSupported:
        count = 0  # a dense warm request reports the engine's count; the executor never verifies 0
    return Prefix(text=text, token_count=count)


async def _warm(
    settings: Settings,
    box: BoxSpec,
    profile: ModelProfile,
    prefix: Prefix | None,
    prefix_text: str | None,
    profiles: dict[str, ModelProfile],
) -> WarmOutcome:
    async with engine_http_client(settings) as client:
        engine = build_engine_dispatcher(settings, client, boxes=[box], profiles=profiles)
        if prefix is None:
            prefix = await _prefix_from_file(engine, box, prefix_text or "")
        return await WarmExecutor(engine, SystemClock()).warm_and_verify(box, profile, prefix)


@click.command("warm")
@click.option("--box", "box_id", help="Box id from the config's fleet.")
@click.option("--agent", "agent_id", help="Agent whose stable prefix to warm (needs --box and a config).")
@click.option(
    "--prefix-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Warm this file's exact text instead of an agent's prefix.",
)
@click.option("--base-url", help="Ad-hoc box URL (with --engine), instead of --box.")
@click.option(
    "--engine", "engine_kind", type=click.Choice([k.value for k in EngineKind]), help="Ad-hoc box engine."
)
@click.option(
    "--block-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Cache granularity in tokens when the server does not report its own page/block size"
    " (SGLang /server_info page_size, vLLM vllm:cache_config_info). Default: the profile's, else 1.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as one JSON object.")
@pass_state
def warm_command(
    state: CliState,
    box_id: str | None,
    agent_id: str | None,
    prefix_file: Path | None,
    base_url: str | None,
    engine_kind: str | None,
    block_tokens: int | None,
    as_json: bool,
) -> None:
    """Warm one prefix on one box and verify it: prints cached tokens / prefix tokens and time taken.

    \b
    warmer --config config/example.toml warm --box llama-1 --agent outbound-sales
    warmer warm --base-url http://127.0.0.1:8091 --engine llamacpp --prefix-file prompt.txt

    Exit status 0 when the engine reported the hit, 1 when it did not, 2 on usage errors, 3 on config
    errors (an unknown box or agent), 4 when the engine does not answer.
    """
    if (agent_id is None) == (prefix_file is None):
        _usage("give exactly one of --agent or --prefix-file")
    if (box_id is None) == (base_url is None):
        _usage("give exactly one of --box (from the config) or --base-url with --engine")
    if base_url is not None and engine_kind is None:
        _usage("--base-url needs --engine")
    if agent_id is not None and box_id is None:
        _usage("--agent needs --box and a config (agents and profiles come from it)")

    prefix: Prefix | None = None
    prefix_text = prefix_file.read_text(encoding="utf-8") if prefix_file is not None else None
    try:
        if box_id is not None:
            loaded, box, profile = _config_target(state, box_id, agent_id)
            settings, profiles = loaded.settings, dict(loaded.profiles)
            if agent_id is not None:
                render, tokenize = offline_prompt_tools(profile)
                prefix = compute_stable_prefix(loaded.agents[agent_id], render, tokenize).as_prefix()
        else:
            if base_url is None or engine_kind is None:
                _usage("--base-url needs --engine")
            settings = state.load_settings()
            kind = EngineKind(engine_kind)
            box = BoxSpec(id="adhoc", base_url=base_url, engine=kind, model="adhoc")
            profile = ModelProfile(name="adhoc", engine=kind)
            profiles = {}
        if block_tokens is not None:
            profile = dataclasses.replace(profile, block_tokens=block_tokens)
        outcome = asyncio.run(_warm(settings, box, profile, prefix, prefix_text, profiles))
    except ConfigError as exc:
        for path, message in exc.problems:
            click.echo(f"{path}: {message}", err=True)
        sys.exit(Exit.CONFIG)
    except EngineUnavailable as exc:
        fail(Exit.UNAVAILABLE, f"engine unavailable: {exc}")
    except EngineError as exc:
        fail(Exit.FAILED, f"engine error: {exc}")
    if as_json:
        click.echo(json.dumps(_outcome_json(outcome), indent=2))
    else:
        click.echo(outcome.describe())
    sys.exit(Exit.OK if outcome.verified else Exit.FAILED)


def _outcome_json(outcome: WarmOutcome) -> dict[str, object]:
    return dataclasses.asdict(outcome)
