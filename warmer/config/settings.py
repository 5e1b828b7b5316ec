"""The daemon's settings: one nested tree read from a TOML file and `WARMER_*` environment variables.

The sections and their defaults live by subject: `server_settings` (database, API, logging), `loop_settings`
(reconcile loop, engines, retries, hit rate, capacity, dialer) and `fleet_settings` (boxes, gateway,
discovery).

Precedence (highest first): environment variables, then the TOML file, then the defaults. Nested
fields use `__` in the environment, e.g. `WARMER_DATABASE__URL`, `WARMER_API__PORT`; lists and tables are
given as JSON, e.g. `WARMER_API__TOKENS='["t1", "t2"]'`. Secrets are `SecretStr`: their repr, `str()` and
JSON dump are masked, so printing or logging the settings never leaks them.

Relative paths written in the TOML file resolve against the file's directory (so a config travels with its
`agents/` and `models/`); defaults and relative paths given in the environment resolve against the working
directory.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from warmer.config.fleet_settings import FleetSettings
from warmer.config.loop_settings import (
    CapacitySettings,
    DialerSettings,
    EngineSettings,
    GateSettings,
    HitRateSettings,
    ReconcileSettings,
    RetrySettings,
    UsageSettings,
)
from warmer.config.server_settings import (
    ApiSettings,
    DatabaseSettings,
    LoggingSettings,
    ReplicaSettings,
    TracingSettings,
)
from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, CacheTier, EngineKind, EngineTimeouts, ModelProfile, RetryPolicy
from warmer.core.observations import validate_stale_after

CONFIG_ENV_VAR = "WARMER_CONFIG"

Problem = tuple[str, str]


class Settings(BaseSettings):
    """The whole configuration. Build it with `load_settings` (file + env) or directly in tests."""

    model_config = SettingsConfigDict(
        env_prefix="WARMER_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    database: DatabaseSettings = Field(default_factory=DatabaseSettings, description="Warm-state store.")
    api: ApiSettings = Field(default_factory=ApiSettings, description="HTTP API bind and credentials.")
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings, description="Loop timing.")
    engines: EngineSettings = Field(default_factory=EngineSettings, description="Engine HTTP timeouts.")
    retry: RetrySettings = Field(default_factory=RetrySettings, description="Transient-failure retries.")
    logging: LoggingSettings = Field(default_factory=LoggingSettings, description="Log level and format.")
    tracing: TracingSettings = Field(
        default_factory=TracingSettings, description="OpenTelemetry traces over OTLP (off by default)."
    )
    fleet: FleetSettings = Field(default_factory=FleetSettings, description="Boxes, profiles, agents.")
    hitrate: HitRateSettings = Field(
        default_factory=HitRateSettings, description="Per-box cache hit-rate monitor and its alert."
    )
    dialer: DialerSettings = Field(
        default_factory=DialerSettings, description="Pre-call API bound and campaign schedule."
    )
    usage: UsageSettings = Field(
        default_factory=UsageSettings, description="Per-turn usage reports (POST/GET /v1/usage): the window."
    )
    capacity: CapacitySettings = Field(
        default_factory=CapacitySettings, description="Prefill budget per agent group (GET /v1/capacity)."
    )
    replicas: ReplicaSettings = Field(
        default_factory=ReplicaSettings, description="Box leases between replicas on one PostgreSQL."
    )
    gate: GateSettings = Field(
        default_factory=GateSettings, description="The admission gate for readiness probes (/admit)."
    )

    @model_validator(mode="after")
    def _observations_outlive_two_polls(self) -> Settings:
        validate_stale_after(self.replicas.observation_stale_seconds, self.reconcile.health_poll_seconds)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment first, then constructor values (the TOML file): env wins, as operators expect.

        No .env or secrets-dir sources: systemd's EnvironmentFile and Kubernetes env cover those.
        """
        return (env_settings, init_settings)

    def engine_timeouts(self) -> EngineTimeouts:
        return self.engines.timeouts()

    def retry_policy(self) -> RetryPolicy:
        return self.retry.policy()

    def database_url(self) -> str:
        """SQLAlchemy URL (embedded SQLite unless `database.url` is set). Secret: never log it."""
        return self.database.sqlalchemy_url()

    def box_specs(self, profiles: Mapping[str, ModelProfile] | None = None) -> tuple[BoxSpec, ...]:
        """The configured boxes as core values; a box without `slots` takes its profile's slot count."""
        specs = []
        for box in self.fleet.boxes:
            profile = (profiles or {}).get(box.model)
            slots = box.slots if box.slots is not None else (profile.slots if profile is not None else 1)
            specs.append(
                BoxSpec(
                    id=box.id,
                    base_url=box.base_url,
                    engine=EngineKind(box.engine),
                    model=box.model,
                    slots=slots,
                    group=box.group,
                    cache_capacity_tokens=box.cache_capacity_tokens,
                    prefix_capacity=box.prefix_capacity,
                    kv_events=None if box.kv_events is None else box.kv_events.endpoint_spec(),
                    warm_tier=CacheTier(box.warm_tier),
                    warm_priority=box.warm_priority,
                )
            )
        return tuple(specs)


# Keys (dotted, in the TOML file) holding paths that resolve against the file's directory.
_FILE_RELATIVE_PATHS = (
    ("database", "state_dir"),
    ("fleet", "models_dir"),
    ("fleet", "agents_dir"),
    ("dialer", "schedule_file"),
)


def field_path(location: Sequence[int | str]) -> str:
    """`('fleet', 'boxes', 1, 'engine')` -> `fleet.boxes[1].engine`."""
    text = ""
    for part in location:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(root)"


def validation_problems(error: ValidationError, prefix: str = "") -> list[Problem]:
    """Each pydantic error as (dotted field path, message); never echoes the value (it may be secret)."""
    problems = []
    for item in error.errors(include_url=False, include_input=False):
        path = field_path(item["loc"])
        if prefix:
            path = prefix if path == "(root)" else f"{prefix}.{path}"
        message = item["msg"].removeprefix("Value error, ")
        problems.append((path, message))
    return problems


def config_path_from_env(environ: Mapping[str, str] | None = None) -> Path | None:
    """The config file named by WARMER_CONFIG, if any."""
    value = (os.environ if environ is None else environ).get(CONFIG_ENV_VAR, "").strip()
    return Path(value) if value else None


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse the TOML file and anchor its relative paths at the file's directory."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError([(str(path), "config file not found")]) from None
    except OSError as exc:
        raise ConfigError([(str(path), f"cannot read config file: {exc.strerror}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([(str(path), f"invalid TOML: {exc}")]) from None
    base = path.parent.absolute()
    for section, key in _FILE_RELATIVE_PATHS:
        table = data.get(section)
        if isinstance(table, dict) and isinstance(table.get(key), str):
            value = Path(table[key]).expanduser()
            table[key] = str(value if value.is_absolute() else base / value)
    return data


def load_settings(path: Path | None = None) -> Settings:
    """Settings from the TOML file at `path` (or WARMER_CONFIG; none = defaults) overlaid by WARMER_* env.

    Raises ConfigError listing every invalid field by its dotted path.
    """
    path = path if path is not None else config_path_from_env()
    data = read_config_file(path) if path is not None else {}
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None


def settings_problems(settings: Settings) -> list[Problem]:
    """Checks across sections that a single field's validation cannot see (box checks live in the loader)."""
    problems: list[Problem] = []
    if not settings.api.tokens and not settings.api.binds_loopback:
        problems.append(
            ("api.tokens", f"no bearer tokens while binding {settings.api.host!r}: the API would be open")
        )
    return problems
