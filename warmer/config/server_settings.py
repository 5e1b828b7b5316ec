"""How the daemon serves and keeps its state: `[database]`, `[api]` and `[logging]`."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from warmer.config.section import Section, http_url
from warmer.core.observations import DEFAULT_STALE_AFTER_SECONDS
from warmer.core.webhook import BoxUrlPolicy, check_box_url_pattern

EMBEDDED_DATABASE_FILE = "warmer.db"


class DatabaseSettings(Section):
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


class ReplicaSettings(Section):
    lease_seconds: float = Field(
        default=15.0,
        gt=0,
        description=(
            "How long a box's lease lasts from its holder's last heartbeat (seconds; PostgreSQL's clock). "
            "Only the holder sends the box warm, restart warm-up and probe work; a replica that dies loses "
            "its boxes to the others within lease_seconds + renew_seconds. At least twice renew_seconds."
        ),
    )
    renew_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Heartbeat interval (seconds): leases are renewed, released to a replica that joined, and free "
            "ones taken up to this replica's fair share (boxes / live replicas, rounded up)."
        ),
    )
    replica_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description=(
            "This daemon's name in the lease table. Default: <hostname>-<pid>-<random>, new on every start "
            "(a restarted replica re-probes what it verified before, like any other)."
        ),
    )

    observation_stale_seconds: float = Field(
        default=DEFAULT_STALE_AFTER_SECONDS,
        gt=0,
        description=(
            "Only a box's lease holder polls its health and epoch; the other replicas read what it saw from "
            "the database. A box whose holder's last poll round is older than this (seconds; PostgreSQL's "
            "clock) counts as not ready on the others, so none routes on a stale view. At least twice "
            "reconcile.health_poll_seconds: one late round must not take the holder's boxes out."
        ),
    )

    @model_validator(mode="after")
    def _lease_outlives_two_renewals(self) -> ReplicaSettings:
        if self.lease_seconds < 2 * self.renew_seconds:
            raise ValueError(
                f"lease_seconds ({self.lease_seconds:g}) must be at least twice renew_seconds "
                f"({self.renew_seconds:g}): one late heartbeat must not lose a lease"
            )
        return self


class ApiSettings(Section):
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


class LoggingSettings(Section):
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


class TracingSettings(Section):
    enabled: bool = Field(
        default=False,
        description=(
            "Send OpenTelemetry traces over OTLP/HTTP: a span per API request (a dialer's `traceparent` "
            "header makes the pre-call ask part of the call's trace) and per engine or gateway request, "
            "the warm a pre-call ask starts included, each carrying `traceparent` to the engine. Off: no "
            "span is made."
        ),
    )
    otlp_endpoint: str = Field(
        default="http://127.0.0.1:4318/v1/traces",
        description="Where spans go: an OTLP/HTTP traces endpoint (a collector, or the backend itself).",
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description=(
            "Share of new traces recorded (0-1). A request that arrives with a sampled `traceparent` is "
            "always recorded, so a dialer's sampling decision holds end to end."
        ),
    )
    service_name: str = Field(default="warmer", min_length=1, description="`service.name` of the spans.")

    @field_validator("otlp_endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str) -> str:
        return http_url(value, "otlp_endpoint")
