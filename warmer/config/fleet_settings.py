"""What the fleet is: `[fleet]` with its boxes, the gateway in front of them and Kubernetes discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from warmer.config.section import Section, http_url
from warmer.core.label_selector import parse_label_selector
from warmer.core.model import EngineKind, KvEventsEndpoint


def _zmq_address(value: str, what: str) -> str:
    """A ZMQ address warmer can connect to: tcp://host:port (no wildcard) or ipc://path."""
    parts = urlsplit(value)
    if parts.scheme == "ipc" and len(value) > len("ipc://"):
        return value
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or "*" in value or port is None:
        raise ValueError(
            f"{what} must be tcp://host:port or ipc://path (the address to connect to), got {value!r}"
        )
    return value


class KvEventsSettings(Section):
    endpoint: str = Field(
        description=(
            "Address of the box's KV cache event publisher as warmer reaches it, e.g. tcp://10.0.0.5:5557 "
            '(vLLM `--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", '
            '"endpoint": "tcp://*:5557"}\'`). Evictions and restarts are then seen as they happen.'
        )
    )
    replay_endpoint: str | None = Field(
        default=None,
        description=(
            "Address of its replay socket (the config's `replay_endpoint`, e.g. tcp://10.0.0.5:5558): missed "
            "events are fetched from it. Unset: a gap in the stream makes warmer fall back to probes."
        ),
    )
    topic: str = Field(default="", description="The publisher's `topic` (vLLM's default is empty).")
    hash_seed: str | None = Field(
        default=None,
        description=(
            "vLLM only: the server's PYTHONHASHSEED, when it runs with a fixed one and "
            "`--prefix-caching-hash-algo sha256_cbor` (vLLM 0.32 without PYTHONHASHSEED seeds sha256_cbor "
            "with the fixed `vllm-none-hash`: name that). Its block hashes are then reproducible: warmer "
            "computes each warmed prefix's own, so an eviction of a prefix warmed before warmer (re)started "
            "is seen at once. Unset: the hashes are learned from the events (residency starts unknown)."
        ),
    )

    @field_validator("endpoint")
    @classmethod
    def _valid_endpoint(cls, value: str) -> str:
        return _zmq_address(value, "endpoint")

    @field_validator("replay_endpoint")
    @classmethod
    def _valid_replay(cls, value: str | None) -> str | None:
        return None if value is None else _zmq_address(value, "replay_endpoint")

    def endpoint_spec(self) -> KvEventsEndpoint:
        return KvEventsEndpoint(self.endpoint, self.replay_endpoint, self.topic, self.hash_seed)


class BoxSettings(Section):
    id: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Stable box name (letters, digits, . _ -): used in URLs, metric labels, the database.",
    )
    base_url: str = Field(
        description="Engine root URL, e.g. http://10.0.0.5:30000 (no /v1). The only URLs warmer ever calls."
    )
    engine: EngineKind = Field(
        description="Engine dialect: sglang, vllm, llamacpp, openai; hosted APIs: openai-hosted, anthropic."
    )
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

    kv_events: KvEventsSettings | None = Field(
        default=None,
        description=(
            "The box's KV cache event stream (vLLM and SGLang boxes: both publish the same events over "
            "ZeroMQ); unset: evictions are found by probe."
        ),
    )
    warm_tier: Literal["device", "host"] = Field(
        default="device",
        description=(
            "SGLang with HiCache (`--enable-hierarchical-cache`) answers how many cached tokens came from "
            "GPU memory and how many from host memory (`meta_info.cached_tokens_details`). `device`: only "
            "GPU hits count as warm (a host hit still copies the KV back to the GPU before the first token); "
            "`host`: either counts. SGLang boxes only."
        ),
    )
    warm_priority: int | None = Field(
        default=None,
        description=(
            "On an SGLang box started with `--radix-eviction-policy priority` (read from /server_info), warm "
            "requests carry this `priority`, so the prefixes they store are evicted after lower-priority "
            "requests' (the policy evicts the lowest priority first, least recently used within one). "
            "Unset: none sent. With `--enable-priority-scheduling` the value also orders scheduling: choose "
            "one that does not jump real calls. SGLang boxes only."
        ),
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description=(
            "Hosted boxes (engine openai-hosted or anthropic): the name of the environment variable holding "
            "the API key, e.g. OPENAI_API_KEY. The key itself is never written in the config nor logged."
        ),
    )

    @field_validator("base_url")
    @classmethod
    def _valid_base_url(cls, value: str) -> str:
        return http_url(value, "base_url")

    @model_validator(mode="after")
    def _engine_options(self) -> BoxSettings:
        if self.kv_events is not None and self.engine not in (EngineKind.VLLM, EngineKind.SGLANG):
            raise ValueError(f"kv_events is read from vllm and sglang boxes only, not {self.engine.value}")
        if (
            self.kv_events is not None
            and self.kv_events.hash_seed is not None
            and self.engine is not EngineKind.VLLM
        ):
            raise ValueError("kv_events.hash_seed reproduces vLLM's block hashes: vllm boxes only")
        if self.engine is not EngineKind.SGLANG:
            if self.warm_tier != "device":
                raise ValueError(f"warm_tier applies to sglang boxes only, not {self.engine.value}")
            if self.warm_priority is not None:
                raise ValueError(f"warm_priority applies to sglang boxes only, not {self.engine.value}")
        if self.engine.hosted and self.api_key_env is None:
            raise ValueError(
                f"a {self.engine.value} box needs api_key_env (the variable holding its API key)"
            )
        if self.api_key_env is not None and not self.engine.hosted:
            raise ValueError(f"api_key_env is for hosted boxes only, not {self.engine.value}")
        return self


class GatewaySettings(Section):
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
        return http_url(value, "url")


class KubernetesDiscoverySettings(Section):
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
            "The longest wait before watching again after the API failed (the backoff starts at 1 s and "
            "doubles up to this). Pods are watched: a new one is a box as soon as the API reports it, and "
            "the reconciler warms it before any route uses it."
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
        return http_url(value, "api_url")

    @field_validator("label_selector")
    @classmethod
    def _valid_label_selector(cls, value: str) -> str:
        parse_label_selector(value)  # a ValueError names the bad requirement
        return value


class FleetSettings(Section):
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
