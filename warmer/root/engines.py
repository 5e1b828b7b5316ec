"""Composition of engine traffic: one shared httpx client, one adapter per engine kind, one dispatcher.

Everything is built from settings (timeouts, retry policy) and the configured boxes, so the daemon and
one-off CLI commands talk to engines the same way, and only to registered boxes.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Iterable, Mapping

import httpx

from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.engines.hosted import AnthropicEngine, OpenAIHostedEngine
from warmer.adapters.engines.http import ControlPool, PoolPerOrigin
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.adapters.engines.openai import OpenAICompatibleEngine
from warmer.adapters.engines.sglang import SglangEngine
from warmer.adapters.engines.vllm import VllmEngine
from warmer.config.settings import Settings
from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, EngineKind, ModelProfile
from warmer.ports import EnginePort
from warmer.root.http import BOX_CONTROL_LIMITS, http_client, pooled_transport


class SystemClock:
    """The real Clock: wall time for records, monotonic time for durations."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def engine_http_client(
    settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The shared client for engine and gateway traffic: engine control reads on a connection pool of
    their own (`ControlPool`), so no poll waits behind the fleet's warm-ups; `transport` replaces both in
    tests. Per-call timeouts are set by the adapters; this is the fallback bound."""
    timeouts = settings.engine_timeouts()
    pools = transport or ControlPool(
        control=PoolPerOrigin(functools.partial(pooled_transport, limits=BOX_CONTROL_LIMITS)),
        work=pooled_transport(),
    )
    return http_client(timeout=httpx.Timeout(timeouts.request, connect=timeouts.connect), transport=pools)


def hosted_api_keys(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Box id -> API key of every hosted box, read from the variable its `api_key_env` names. A variable
    that is unset or empty is a ConfigError naming the field (never the value)."""
    env = os.environ if environ is None else environ
    keys: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for index, box in enumerate(settings.fleet.boxes):
        if box.api_key_env is None:
            continue
        value = env.get(box.api_key_env, "").strip()
        if value:
            keys[box.id] = value
        else:
            problems.append(
                (f"fleet.boxes[{index}].api_key_env", f"environment variable {box.api_key_env} is unset")
            )
    if problems:
        raise ConfigError(problems)
    return keys


def build_engine_dispatcher(
    settings: Settings,
    client: httpx.AsyncClient,
    *,
    boxes: Iterable[BoxSpec],
    profiles: Mapping[str, ModelProfile] | None = None,
) -> EngineDispatcher:
    """An EnginePort for every configured engine kind, limited to `boxes`."""
    timeouts = settings.engine_timeouts()
    retry = settings.retry_policy()
    served = {name: p.served_model_name for name, p in (profiles or {}).items() if p.served_model_name}
    engines: dict[EngineKind, EnginePort] = {
        EngineKind.LLAMACPP: LlamaCppEngine(client, timeouts=timeouts, retry=retry),
        EngineKind.VLLM: VllmEngine(client, timeouts=timeouts, retry=retry, served_models=served),
        EngineKind.SGLANG: SglangEngine(client, timeouts=timeouts, retry=retry),
        EngineKind.OPENAI: OpenAICompatibleEngine(
            client, timeouts=timeouts, retry=retry, served_models=served
        ),
    }
    if any(box.api_key_env is not None for box in settings.fleet.boxes):
        keys, known = hosted_api_keys(settings), profiles or {}
        for kind, adapter in (
            (EngineKind.OPENAI_HOSTED, OpenAIHostedEngine),
            (EngineKind.ANTHROPIC, AnthropicEngine),
        ):
            engines[kind] = adapter(client, profiles=known, api_keys=keys, timeouts=timeouts, retry=retry)
    return EngineDispatcher(engines, boxes=boxes)
