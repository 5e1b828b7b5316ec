"""Load and validate the whole configuration at once: settings, model profiles, boxes, agent specs.

Every problem is collected before anything is reported, so one `warmer check-config` run lists them all,
each with its field path (`fleet.boxes[1].engine`, `profiles.dense-vllm.slots`, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warmer.config.agents import load_agent_specs
from warmer.config.profiles import load_profile_set
from warmer.config.settings import (
    Problem,
    Settings,
    config_path_from_env,
    load_settings,
    read_config_file,
    settings_problems,
)
from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, EngineKind, ModelProfile

# Reads an agents directory into specs; `load_config` takes another (e.g. a test's) in its place.
AgentLoader = Callable[[Path], Mapping[str, AgentSpec]]


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated configuration, ready for the composition root."""

    settings: Settings
    profiles: Mapping[str, ModelProfile]
    boxes: tuple[BoxSpec, ...]
    agents: Mapping[str, AgentSpec] = field(default_factory=dict)  # by agent id
    source: Path | None = None  # the TOML file read, if any


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def box_problems(
    boxes: Sequence[Mapping[str, Any]], profiles: Mapping[str, ModelProfile] | None
) -> list[Problem]:
    """Cross-checks over the box tables: unique ids and URLs, a known profile with the same engine.

    Works on plain tables so it also runs when some fields failed validation (each check skips values
    that are not even strings; those already have their own problem). `profiles` None = not loadable.
    """
    problems: list[Problem] = []
    seen_ids: dict[str, int] = {}
    seen_urls: dict[str, int] = {}
    known = ", ".join(sorted(profiles or {})) or "none"
    for index, box in enumerate(boxes):
        at = f"fleet.boxes[{index}]"
        box_id = _text(box.get("id"))
        if box_id is not None:
            if box_id in seen_ids:
                problems.append(
                    (f"{at}.id", f"duplicate box id {box_id!r} (also fleet.boxes[{seen_ids[box_id]}])")
                )
            else:
                seen_ids[box_id] = index
        url = _text(box.get("base_url"))
        if url is not None:
            key = url.rstrip("/").lower()
            if key in seen_urls:
                problems.append(
                    (f"{at}.base_url", f"duplicate base_url {url!r} (also fleet.boxes[{seen_urls[key]}])")
                )
            else:
                seen_urls[key] = index
        model = _text(box.get("model"))
        if model is None or profiles is None:
            continue
        profile = profiles.get(model)
        if profile is None:
            problems.append((f"{at}.model", f"unknown model profile {model!r} (known: {known})"))
            continue
        engine = _text(box.get("engine"))
        if engine in {kind.value for kind in EngineKind} and engine != profile.engine.value:
            problems.append(
                (
                    f"{at}.engine",
                    f"engine {engine!r} differs from profile {model!r} engine {profile.engine.value!r}",
                )
            )
    return problems


def load_config(path: Path | None = None, *, agent_loader: AgentLoader | None = None) -> LoadedConfig:
    """Read the config file (`path`, else WARMER_CONFIG, else defaults) + env, and validate everything.

    `agent_loader` overrides the agent spec loader (tests); by default `warmer.config.agents` is used when
    present. Raises ConfigError with every problem found (field errors, profile errors, cross-checks).
    """
    path = path if path is not None else config_path_from_env()
    problems: list[Problem] = []
    settings: Settings | None = None
    try:
        settings = load_settings(path)
    except ConfigError as exc:
        problems += exc.problems

    if settings is not None:
        problems += settings_problems(settings)
        models_dir = settings.fleet.models_dir
        boxes: list[Mapping[str, Any]] = [box.model_dump(mode="json") for box in settings.fleet.boxes]
    else:
        # Some fields are invalid: still check what can be checked, from the file as written.
        raw = read_config_file(path) if path is not None else {}
        raw_fleet = raw.get("fleet")
        fleet: dict[str, Any] = raw_fleet if isinstance(raw_fleet, dict) else {}
        raw_models_dir = fleet.get("models_dir")
        models_dir = Path(raw_models_dir) if isinstance(raw_models_dir, str) else None
        raw_boxes = fleet.get("boxes")
        boxes = [b for b in raw_boxes if isinstance(b, dict)] if isinstance(raw_boxes, list) else []

    profiles: dict[str, ModelProfile] | None = None
    try:
        profiles = load_profile_set(models_dir)
    except ConfigError as exc:
        problems += exc.problems
    problems += box_problems(boxes, profiles)
    discovery = settings.fleet.discovery if settings is not None else None
    if discovery is not None and profiles is not None:
        profile = profiles.get(discovery.model)
        if profile is None:
            known = ", ".join(sorted(profiles))
            problems.append(
                ("fleet.discovery.model", f"unknown model profile {discovery.model!r} (known: {known})")
            )
        elif profile.engine is not discovery.engine:
            problems.append(
                (
                    "fleet.discovery.engine",
                    f"engine {discovery.engine.value!r} differs from profile {discovery.model!r} engine "
                    f"{profile.engine.value!r}",
                )
            )

    agents: Mapping[str, AgentSpec] = {}
    agents_dir = settings.fleet.agents_dir if settings is not None else None
    if agents_dir is not None:
        loader = agent_loader if agent_loader is not None else load_agent_specs
        if not agents_dir.is_dir():
            problems.append(("fleet.agents_dir", f"directory not found: {agents_dir}"))
        else:
            try:
                agents = loader(agents_dir)
            except ConfigError as exc:
                problems += exc.problems
            if profiles is not None:
                for agent_id, agent in agents.items():
                    if agent.model not in profiles:
                        problems.append(
                            (f"agents.{agent_id}.model", f"unknown model profile {agent.model!r}")
                        )

    if problems or settings is None or profiles is None:
        raise ConfigError(problems)
    return LoadedConfig(
        settings=settings,
        profiles=profiles,
        boxes=settings.box_specs(profiles),
        agents=agents,
        source=path,
    )
