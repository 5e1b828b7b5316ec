"""The daemon's settings: one nested tree read from a TOML file and `WARMER_*` environment variables.

Precedence (highest first): environment variables, then the TOML file, then the defaults below. Nested
fields use `__` in the environment, e.g. `WARMER_DATABASE__URL`, `WARMER_API__PORT`; lists and tables are
given as JSON, e.g. `WARMER_API__TOKENS='["t1", "t2"]'`. Secrets are `SecretStr`: their repr, `str()` and
JSON dump are masked, so printing or logging the settings never leaks them.

Relative paths written in the TOML file resolve against the file's directory (so a config travels with its
`agents/` and `models/`); defaults and relative paths given in the environment resolve against the working
directory.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, EngineKind, EngineTimeouts, ModelProfile, RetryPolicy
from warmer.core.webhook import BoxUrlPolicy, check_box_url_pattern

CONFIG_ENV_VAR = "WARMER_CONFIG"
EMBEDDED_DATABASE_FILE = "warmer.db"

Problem = tuple[str, str]


class _Section(BaseModel):
    """Every section rejects unknown keys: a typo must be an error, not a silently ignored setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _http_url(value: str, what: str) -> str:
    """An absolute http(s) URL with a host, without a trailing slash (paths are appended to it)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an absolute http:// or https:// URL with a host, got {value!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} must not carry a query or fragment, got {value!r}")
    return value.rstrip("/")


class DatabaseSettings(_Section):
    url: SecretStr | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL of the warm-state database, e.g. postgresql+psycopg://user:pw@host/db. "
            "Empty (the default) means an embedded SQLite file `<state_dir>/warmer.db`: one replica needs "
            "no database server. A secret because URLs usually carry a password."
        ),
    )
    state_dir: Path = Field(
        default=Path("state"),
        description=(
            "Directory for local state (the embedded SQLite file). Created on start. Relative to the config "
            "file's directory when set there; systemd/Kubernetes point it at /var/lib/warmer."
        ),
    )
    pool_size: int = Field(
        default=5,
        ge=1,
        description=(
            "Connections kept open to a server database (count; the embedded SQLite file ignores it). The "
            "daemon runs a few concurrent transactions (reconcile, API): 5 avoids waits without hogging "
            "a shared PostgreSQL."
        ),
    )
    pool_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds to wait for a free pooled server-database connection before failing. Longer than any "
            "healthy transaction, short enough that a stuck database shows up in /readyz promptly."
        ),
    )

    @field_validator("url", mode="before")
    @classmethod
    def _empty_url_means_embedded(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @property
    def is_embedded(self) -> bool:
        """True when the database is the embedded SQLite file (serve then migrates it by itself)."""
        return self.url is None

    def sqlalchemy_url(self) -> str:
        """The URL to hand to SQLAlchemy/Alembic. Contains the secret: never log the return value."""
        if self.url is not None:
            return self.url.get_secret_value()
        return f"sqlite:///{(self.state_dir / EMBEDDED_DATABASE_FILE).absolute()}"


# Request body limits of the API (bytes): the defaults of `api.max_request_bytes` and
# `api.webhook_max_body_bytes`, also used by an app built without settings (tests, tools).
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024
DEFAULT_WEBHOOK_MAX_BODY_BYTES = 4 * 1024 * 1024


class ApiSettings(_Section):
    host: str = Field(
        default="127.0.0.1",
        description=(
            "Address the HTTP API binds to. Loopback by default so a fresh install exposes nothing; "
            "set 0.0.0.0 in containers, together with `tokens`."
        ),
    )
    port: int = Field(
        default=8470,
        ge=1,
        le=65535,
        description=(
            "TCP port of the HTTP API. 8470 stays clear of the engines' own defaults "
            "(llama-server 8080, vLLM 8000, SGLang 30000) so the daemon can share a host with them."
        ),
    )
    tokens: list[SecretStr] = Field(
        default_factory=list,
        description=(
            "Bearer tokens accepted by the dialer and ops APIs (any one of them). Several, so a token can "
            "be rotated without downtime. Empty is allowed only on a loopback bind (local development)."
        ),
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description=(
            "HMAC secret that signs deploy webhooks. Unset means the deploy webhook refuses every call: "
            "an unsigned webhook would let anyone trigger warm-ups."
        ),
    )
    webhook_tolerance_seconds: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Maximum age of a webhook's signed timestamp (seconds), bounding replay of a captured request. "
            "5 minutes tolerates clock skew between the pipeline and this host."
        ),
    )
    webhook_previous_secrets: list[SecretStr] = Field(
        default_factory=list,
        description=(
            "Older webhook secrets still accepted while the deploy pipeline moves to `webhook_secret` "
            "(rotation without downtime); remove them once every sender signs with the new one."
        ),
    )
    webhook_box_url_patterns: list[str] = Field(
        default_factory=list,
        description=(
            "Patterns a `box.added` event's base_url must match, written like the URL "
            "`scheme://host[:port][/path]` with shell-glob wildcards, e.g. `http://10.0.3.*:30000`. "
            "The URL is parsed and matched part by part (scheme, each host label, port, each path "
            "segment), so `*` never spans a `.`, `:` or `/`, and a numeric host pattern admits only IPv4 "
            "addresses. Empty: events cannot add boxes, so a webhook can never point the daemon at a URL "
            "the operator did not allow."
        ),
    )

    max_request_bytes: int = Field(
        default=DEFAULT_MAX_REQUEST_BYTES,
        ge=1024,
        le=16 * 1024 * 1024,
        description=(
            "Largest body `POST /v1/prewarm` and `PUT /v1/campaigns/{id}` read (bytes); a bigger one is "
            "refused with 413 before it is parsed. 64 KiB is hundreds of times a real ask or campaign."
        ),
    )
    webhook_max_body_bytes: int = Field(
        default=DEFAULT_WEBHOOK_MAX_BODY_BYTES,
        ge=1024,
        le=256 * 1024 * 1024,
        description=(
            "Largest deploy webhook body read (bytes); a bigger one is refused with 413. 4 MiB holds an "
            "agent prompt spec with its reference material inline, with room to spare."
        ),
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description=(
            "Event loop of the daemon: uvloop (libuv) spends less CPU per request and per socket event than "
            "asyncio's pure-Python loop, which a dialer's pre-call asks (thousands a second) feel first."
        ),
    )
    http_parser: Literal["httptools", "h11"] = Field(
        default="httptools",
        description=(
            "HTTP/1.1 parser of the API server: httptools (llhttp, C) instead of h11 (pure Python), "
            "several times less CPU per request."
        ),
    )
    backlog: int = Field(
        default=2048,
        ge=16,
        le=65535,
        description=(
            "Connections the kernel queues for the API before it accepts them, so a dialer opening many "
            "connections at once (a campaign start) is queued, not refused. Capped by net.core.somaxconn."
        ),
    )
    access_log: bool = Field(
        default=False,
        description=(
            "One log line per API request. Off: at a dialer's rate the lines would be most of the daemon's "
            "log volume and a large share of its CPU; request counts and latencies are in /metrics."
        ),
    )

    def webhook_secrets(self) -> list[str]:
        """Every secret a webhook signature may use, current first. Secret: never log them."""
        current = [self.webhook_secret] if self.webhook_secret is not None else []
        values = [secret.get_secret_value() for secret in (*current, *self.webhook_previous_secrets)]
        return [value for value in values if value]

    @field_validator("webhook_box_url_patterns")
    @classmethod
    def _patterns_parse(cls, value: list[str]) -> list[str]:
        for pattern in value:
            check_box_url_pattern(pattern)
        return value

    def box_url_policy(self) -> BoxUrlPolicy:
        return BoxUrlPolicy(tuple(self.webhook_box_url_patterns))

    @property
    def binds_loopback(self) -> bool:
        """True when only this host can reach the API."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class ReconcileSettings(_Section):
    interval_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between reconcile passes (desired vs observed warm state). Short next to keepalive "
            "horizons (minutes), so a missing prefix is noticed within seconds, yet cheap: a pass is local."
        ),
    )
    health_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between engine health/epoch polls per box. A restart is caught within this bound, "
            "before the gateway sends real calls to a cold process."
        ),
    )
    keepalive_jitter_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description=(
            "Random spread applied to each keepalive delay, as a fraction of it (0.1 = +/-10%). Spreads "
            "touches so many prefixes warmed together do not all come due in the same second."
        ),
    )
    max_concurrent_warms_per_box: int = Field(
        default=2,
        ge=1,
        description=(
            "Warm requests in flight per box at once (count). Two keeps warming from competing with real "
            "calls for the engine's batch while still overlapping network and prefill."
        ),
    )
    warm_budget_tokens_per_second: int = Field(
        default=8000,
        ge=1,
        description=(
            "Uncached (prefilled) warm tokens per second per box. Caps warming at a small share of a GPU's "
            "prefill throughput so warming never becomes the load."
        ),
    )
    ramp_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds over which a newly ready box goes from `initial_ramp_weight` to full routing weight. "
            "A minute lets its hit rate and latency be seen on a small slice first; 0 disables ramping."
        ),
    )
    initial_ramp_weight: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Routing weight (0..1] a box gets the moment it becomes ready: a small slice first.",
    )
    shutdown_grace_seconds: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds root tasks get to finish after SIGTERM/SIGINT before they are cancelled. 10 s fits "
            "inside Kubernetes' default 30 s termination grace and systemd's TimeoutStopSec."
        ),
    )
    retire_idle_after_seconds: float = Field(
        default=3600.0,
        ge=0,
        description=(
            "Seconds without traffic (calls, pre-call asks; a new agent counts from when it is first seen) "
            "after which an agent's prefixes stop being kept warm on its boxes; campaigns and pre-call asks "
            "still warm it. An hour spans a lunch break without paying keepalive touches all night. "
            "0 means never: keep every assigned agent warm forever."
        ),
    )

    def retire_idle_after(self) -> float | None:
        """The planner's idle cut-off: None (never retire) for 0, since TOML has no null to write."""
        return self.retire_idle_after_seconds or None


class EngineSettings(_Section):
    connect_timeout_seconds: float = Field(
        default=2.0, gt=0, description="Seconds to open a TCP connection to an engine; loopback/LAN is fast."
    )
    health_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        description="Seconds a health/epoch call may take; a slower answer is treated as unhealthy.",
    )
    request_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds for one warm or probe request. A cold prefill of a long prefix on a busy engine can "
            "take many seconds; a minute catches hangs without failing honest work."
        ),
    )
    long_request_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Seconds for restart warm-up requests (bursts, the very long prefill). The first sampled request "
            "after a restart may pay kernel compilation (~17 s seen on SGLang), so this is generous."
        ),
    )

    def timeouts(self) -> EngineTimeouts:
        return EngineTimeouts(
            connect=self.connect_timeout_seconds,
            health=self.health_timeout_seconds,
            request=self.request_timeout_seconds,
            long_request=self.long_request_timeout_seconds,
        )


class RetrySettings(_Section):
    attempts: int = Field(
        default=3,
        ge=1,
        description="Total tries of a transient engine failure, including the first (count).",
    )
    initial_backoff_seconds: float = Field(
        default=0.2,
        ge=0,
        description="Seconds before the first retry; doubled per retry. Short: most blips are momentary.",
    )
    max_backoff_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Cap on one backoff (seconds), so a retry never outlives a reconcile pass by much.",
    )
    jitter_seconds: float = Field(
        default=0.1,
        ge=0,
        description="Random seconds added to each backoff so retries across boxes do not synchronize.",
    )

    @model_validator(mode="after")
    def _cap_not_below_start(self) -> RetrySettings:
        if self.max_backoff_seconds < self.initial_backoff_seconds:
            raise ValueError("max_backoff_seconds must be >= initial_backoff_seconds")
        return self

    def policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.attempts,
            initial_backoff_seconds=self.initial_backoff_seconds,
            max_backoff_seconds=self.max_backoff_seconds,
            jitter_seconds=self.jitter_seconds,
        )


class LoggingSettings(_Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="Lowest level written. INFO shows state transitions without per-request noise.",
    )
    format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description=(
            "`json` (one object per line, for log shippers), `console` (for people), or `auto`: console "
            "when stderr is a terminal, JSON otherwise (systemd journal, Kubernetes)."
        ),
    )

    libraries: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="WARNING",
        description=(
            "Lowest level written by httpx/httpcore and APScheduler, which log a line per engine request "
            "and per timer tick at INFO. WARNING keeps their failures; the daemon logs state changes itself."
        ),
    )

    @field_validator("level", "libraries", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value


class HitRateSettings(_Section):
    poll_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds between scrapes of each box's cache counters; the hit rate is computed over the "
            "traffic between two scrapes. A minute holds enough calls to judge, and one scrape per box "
            "per minute costs the engine nothing."
        ),
    )
    threshold: float = Field(
        default=0.90,
        ge=0,
        le=1,
        description=(
            "Hit ratio (0..1) below which a box alerts (metric and log event). 0.90 is the healthy bar "
            "seen in the field for agents whose long stable prefix is warm."
        ),
    )
    min_tokens_per_window: int = Field(
        default=10000,
        ge=0,
        description=(
            "Prompt tokens a box must have looked up between two scrapes before its ratio is judged, so an "
            "idle box with a few health checks or probes never alerts, and an alert clears once the box "
            "goes idle (about five calls' worth of prefix)."
        ),
    )


class CapacitySettings(_Section):
    safe_fraction: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description=(
            "Share of a box's prefill ceiling (uncached prompt tokens/s at full load) that `GET "
            "/v1/capacity` counts as its budget. 0.6: in the field, time to first token broke at about 60% "
            "of the ceiling, whatever mix of cached and uncached calls produced the load."
        ),
    )
    max_usage_age_seconds: float = Field(
        default=180.0,
        gt=0,
        description=(
            "A box's uncached-token window (from the hit-rate monitor's scrapes) older than this is not "
            "counted as its current use; keep it above `hitrate.poll_seconds`."
        ),
    )


class DialerSettings(_Section):
    prewarm_max_wait_seconds: float = Field(
        default=10.0,
        ge=0,
        le=60,
        description=(
            "Longest a `POST /v1/prewarm` caller may wait for a warm (its `wait_ms` is capped to this). "
            "10 s covers a cold prefill of a long prefix on a busy box yet keeps a dialer worker from "
            "hanging on a box that will not warm."
        ),
    )
    campaign_lead_seconds: float = Field(
        default=300.0,
        ge=0,
        description=(
            "Seconds before a campaign's window opens that its agent's prefixes are warmed (and its group "
            "widened for its volume). Five minutes covers a restart warm-up plus prefix warms on a cold box."
        ),
    )
    precall_hold_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds a pre-call ask (`POST /v1/prewarm`) keeps its agent at the top warm priority, ahead "
            "of campaigns and keepalives. 60 s outlasts the longest prewarm wait and the dial-and-ring "
            "time until the call's first turn, yet an ask with no call behind it stops jumping the queue "
            "within a minute."
        ),
    )
    volume_window_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Sliding window (seconds) over which pre-call asks are counted as an agent's observed call "
            "volume (calls/minute) for placement. A minute follows a dialer burst without flapping groups."
        ),
    )
    schedule_file: Path | None = Field(
        default=None,
        description=(
            "Optional JSON or TOML file listing campaigns (id, agent, starts_at, ends_at, expected_calls), "
            "synced into the store by id; campaigns booked through the API are never touched by it."
        ),
    )
    poll_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between reads of `schedule_file`; well under any campaign lead time.",
    )


class BoxSettings(_Section):
    id: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Stable box name (letters, digits, . _ -): used in URLs, metric labels, the database.",
    )
    base_url: str = Field(
        description="Engine root URL, e.g. http://10.0.0.5:30000 (no /v1). The only URLs warmer ever calls."
    )
    engine: EngineKind = Field(description="Engine dialect: sglang, vllm, llamacpp or openai.")
    model: str = Field(
        min_length=1, description="Name of a model profile (shipped, or a file `<models_dir>/<name>.toml`)."
    )
    slots: int | None = Field(
        default=None,
        ge=1,
        description="Concurrent sequences the engine serves (count). Unset: the model profile's slot count.",
    )
    group: str = Field(default="", description="Optional placement group (rack, region, dedicated pool).")
    cache_capacity_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Prefix tokens the box's cache holds, when known; bounds how many prefixes it is given.",
    )
    prefix_capacity: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Distinct prefixes the box holds at once, beside its live calls. Unset: what the engine reports "
            "(llama.cpp: one per slot). Set it for a llama.cpp host prompt cache (--cache-ram), whose size "
            "the engine does not report."
        ),
    )

    @field_validator("base_url")
    @classmethod
    def _valid_base_url(cls, value: str) -> str:
        return _http_url(value, "base_url")


class GatewaySettings(_Section):
    url: str = Field(description="Root URL of the router in front of the boxes (e.g. SGLang Model Gateway).")
    api_style: Literal["workers", "legacy"] = Field(
        default="workers",
        description=(
            "`workers`: POST/GET/DELETE /workers (current SGLang Model Gateway); `legacy`: the older "
            "/add_worker, /remove_worker, /list_workers endpoints of sglang-router."
        ),
    )
    sync_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds between full gateway sync passes (a pass also runs right after any readiness change). "
            "Each pass re-reads the router's worker list, so a worker added or removed behind warmer's back "
            "is corrected within this bound; as short as the health poll so a missed change costs little."
        ),
    )

    @field_validator("url")
    @classmethod
    def _valid_url(cls, value: str) -> str:
        return _http_url(value, "url")


class KubernetesDiscoverySettings(_Section):
    """`[fleet.discovery]`: engine pods found through the Kubernetes API, next to the configured boxes."""

    namespace: str = Field(min_length=1, description="Namespace of the engine pods.")
    label_selector: str = Field(
        min_length=1, description="Label selector of the engine pods, e.g. `app=sglang` (Kubernetes syntax)."
    )
    port: int = Field(ge=1, le=65535, description="The engines' HTTP port on each pod.")
    scheme: Literal["http", "https"] = Field(default="http", description="How the engines are called.")
    engine: EngineKind = Field(description="Engine dialect of every discovered pod.")
    model: str = Field(min_length=1, description="Model profile of every discovered pod.")
    slots: int | None = Field(default=None, ge=1, description="Slots per pod; unset: the profile's.")
    group: str = Field(default="", description="Placement group of the discovered boxes.")
    interval_seconds: float = Field(
        default=15.0,
        gt=0,
        description=(
            "Seconds between listings. A new pod is a box within this bound; the reconciler then warms it "
            "before any route uses it, so a short interval costs one small API call and no traffic."
        ),
    )
    api_url: str = Field(
        default="https://kubernetes.default.svc",
        description="The Kubernetes API server; the default is the in-cluster address.",
    )
    token_file: Path = Field(
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="Bearer token file (re-read on every listing: projected tokens rotate).",
    )
    ca_file: Path | None = Field(
        default=Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        description="CA bundle that signs the API server's certificate; unset: the system's trust store.",
    )

    @field_validator("api_url")
    @classmethod
    def _valid_api_url(cls, value: str) -> str:
        return _http_url(value, "api_url")


class FleetSettings(_Section):
    models_dir: Path | None = Field(
        default=None,
        description=(
            "An extra model profile directory (`<name>.toml` files) on top of the profiles shipped with "
            "warmer; a file here replaces the shipped profile of the same name. Unset = the shipped set "
            "only. Relative to the config file if set there."
        ),
    )
    agents_dir: Path | None = Field(
        default=None,
        description="Directory of agent prompt spec files; unset means no agents are loaded.",
    )
    boxes: list[BoxSettings] = Field(
        default_factory=list, description="The engine boxes warmer manages (may be empty at first)."
    )
    gateway: GatewaySettings | None = Field(
        default=None,
        description="Router to register warm boxes with and withdraw cold ones from; unset means none.",
    )
    discovery: KubernetesDiscoverySettings | None = Field(
        default=None,
        description="Engine pods discovered through the Kubernetes API, besides `boxes`; unset means none.",
    )


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
    fleet: FleetSettings = Field(default_factory=FleetSettings, description="Boxes, profiles, agents.")
    hitrate: HitRateSettings = Field(
        default_factory=HitRateSettings, description="Per-box cache hit-rate monitor and its alert."
    )
    dialer: DialerSettings = Field(
        default_factory=DialerSettings, description="Pre-call API bound and campaign schedule."
    )
    capacity: CapacitySettings = Field(
        default_factory=CapacitySettings, description="Prefill budget per agent group (GET /v1/capacity)."
    )

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
