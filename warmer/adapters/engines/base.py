"""What every engine adapter shares: typed body checks, the Prometheus counters, the `EngineAdapter` base.

Every adapter talks to one box through `EngineHttp` (`warmer.adapters.engines.http`: URLs only from the
box's registered `base_url`, transient-only retries); engines without a process identity get their epochs
from `RestartWatch` (`warmer.adapters.engines.restart_watch`). Failures come out as the typed errors of
`warmer.core.errors`: a response we cannot trust is never turned into a number, so nothing downstream can
mistake it for a verified warm.
"""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

import httpx

from warmer.adapters.engines.http import EngineHttp, EngineRejected, HealthAnswer
from warmer.adapters.engines.restart_watch import RestartWatch
from warmer.core.capacity import prefix_budget_tokens
from warmer.core.errors import CacheFieldMissing, EngineError, EngineSlow, MalformedResponse, NotSupported
from warmer.core.hitrate import CACHE_COUNTERS, cache_stats_from_samples
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    CompletionReport,
    EngineKind,
    EngineTimeouts,
    Prefix,
    RetryPolicy,
)
from warmer.core.promtext import MetricsTextError, Sample, parse_prometheus_text, sum_samples


def dig(body: Mapping[str, Any], dotted: str) -> Any:
    """`body["a"]["b"]` for "a.b"; None where any step is absent or not an object."""
    value: Any = body
    for key in dotted.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def count_field(
    box: BoxSpec,
    path: str,
    body: Mapping[str, Any],
    dotted: str,
    *,
    cache_field: bool = False,
    hint: str = "",
) -> int:
    """A token count from the body: a non-negative integer, or a typed error naming the field.

    A missing cache field raises CacheFieldMissing (usually a server flag that is off, see `hint`);
    a present but nonsensical value raises MalformedResponse. Never a default of 0.
    """
    value = dig(body, dotted)
    if value is None:
        error = CacheFieldMissing if cache_field else MalformedResponse
        suffix = f" ({hint})" if hint else ""
        raise error(box.id, f"{path} response lacks `{dotted}`{suffix}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedResponse(box.id, f"{path} response field `{dotted}` is not a number: {value!r}")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise MalformedResponse(box.id, f"{path} response field `{dotted}` is not a whole count: {value!r}")
    count = int(value)
    if count < 0:
        raise MalformedResponse(box.id, f"{path} response field `{dotted}` is negative: {count}")
    return count


def optional_seconds(body: Mapping[str, Any], dotted: str, *, scale: float = 1.0) -> float | None:
    value = dig(body, dotted)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value) * scale


def check_cached_within_prompt(box: BoxSpec, path: str, prompt_tokens: int, cached_tokens: int) -> None:
    if cached_tokens > prompt_tokens:
        raise MalformedResponse(
            box.id, f"{path} reports {cached_tokens} cached tokens of only {prompt_tokens} prompt tokens"
        )


def reject_error_body(box: BoxSpec, path: str, body: Mapping[str, Any], *, unless: str) -> None:
    """EngineError for an `error` body that lacks the field (`unless`) a real answer always carries."""
    if "error" in body and unless not in body:
        raise EngineError(box.id, f"{path} returned an error: {body['error']!r}")


def string_field(box: BoxSpec, path: str, body: Mapping[str, Any], name: str) -> str:
    """`body[name]` as a string, or MalformedResponse naming the endpoint and field."""
    value = body.get(name)
    if not isinstance(value, str):
        raise MalformedResponse(box.id, f"{path} response lacks a string `{name}`")
    return value


@contextmanager
def unsupported_when_rejected(
    box: BoxSpec, message: str, *, statuses: Collection[int] | None = None
) -> Iterator[None]:
    """Turn an engine's 4xx for a route or feature it lacks into NotSupported, so callers can fall back.

    With `statuses`, only those codes mean "lacks it" and any other rejection is re-raised as is.
    """
    try:
        yield
    except EngineRejected as exc:
        if statuses is None or exc.status in statuses:
            raise NotSupported(box.id, message) from exc
        raise


def fingerprint_digest(fields: Mapping[str, object], *, length: int) -> str:
    """A short stable hash of engine-reported identity fields (key order and value types do not matter)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:length]


def token_list(box: BoxSpec, path: str, value: Any, *, field_name: str = "tokens") -> list[int]:
    """A list of token ids, or MalformedResponse."""
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise MalformedResponse(box.id, f"{path} response `{field_name}` is not a list of token ids")
    return list(value)


# --- Prometheus text exposition -------------------------------------------------------------------


def parse_metrics(box: BoxSpec, text: str) -> list[Sample]:
    """Samples of a /metrics body (parsed by the pure core parser), or MalformedResponse."""
    try:
        return parse_prometheus_text(text)
    except MetricsTextError as exc:
        raise MalformedResponse(box.id, f"/metrics body is not Prometheus text: {exc}") from exc


def process_start_time(samples: Sequence[Sample]) -> float | None:
    """Prometheus client's `process_start_time_seconds` (unix seconds the process started), if exposed.

    With several series (multiprocess servers) the earliest is the server's own start.
    """
    values = [s.value for s in samples if s.name == "process_start_time_seconds"]
    return min(values) if values else None


def cache_stats_of(box: BoxSpec, engine: EngineKind, samples: Sequence[Sample]) -> CacheStats:
    """The one /metrics -> CacheStats rule (`warmer.core.hitrate.cache_stats_from_samples`, which the CLI
    uses too), with the adapters' typed errors: no counters this engine kind writes is NotSupported, one of
    the pair missing is MalformedResponse. Never a 0 for an absent counter."""
    try:
        stats = cache_stats_from_samples(engine, samples)
    except ValueError as exc:
        raise NotSupported(box.id, f"/metrics: {exc}") from None
    if stats.queried_tokens is None or stats.hit_tokens is None:
        names = CACHE_COUNTERS.get(engine)
        wanted = " and ".join(group[0] for group in names) if names else "prefix-cache counters"
        raise MalformedResponse(box.id, f"/metrics lacks {wanted}")
    return stats


def metric_sum(samples: Sequence[Sample], *names: str) -> float | None:
    """Sum over label sets of the first metric name present; None if none is exposed."""
    for name in names:
        total = sum_samples(samples, name)
        if total is not None:
            return total
    return None


def busiest_share(samples: Sequence[Sample], name: str) -> float | None:
    """The highest value of a usage-ratio gauge over its series (one per data-parallel rank or engine): the
    rank with the least room bounds what a prefix may count on. None when the gauge is not exposed or
    holds no finite ratio."""
    values = [s.value for s in samples if s.name == name and math.isfinite(s.value) and s.value >= 0]
    return max(values) if values else None


def pool_capacity(pool_tokens: int, used_share: float | None, source: str) -> BoxCapacity:
    """A shared token pool's capacity: its size, the share live calls hold, and the prefix budget they leave
    under the default headroom (the reconciler re-derives it under its configured one)."""
    return BoxCapacity(
        tokens=prefix_budget_tokens(pool_tokens, used_share),
        pool_tokens=pool_tokens,
        used_share=used_share,
        source=source if used_share is not None else f"{source} (used share not reported: taken as idle)",
    )


# --- What every adapter shares ------------------------------------------------------------------------

PromptT = TypeVar("PromptT")


class EngineAdapter(ABC, Generic[PromptT]):
    """The common half of an EnginePort: one `EngineHttp`, one `RestartWatch`, one completion flow.

    An engine says how a prefix becomes its prompt (`_prompt_for`, `PromptT` being any non-text form it
    accepts, e.g. token ids) and how one completion is made (`_complete`). Warming then is always greedy
    with the default time limit, and a restart warm-up always the caller's sampling with the long one.
    """

    engine_kind: EngineKind  # whose /metrics counters `cache_stats` reads
    metrics_off_hint = "the server exposes no /metrics"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        timeouts: EngineTimeouts | None = None,
        retry: RetryPolicy | None = None,
        watch: RestartWatch | None = None,
    ) -> None:
        self._http = EngineHttp(client, timeouts=timeouts, retry=retry)
        self._watch = watch or RestartWatch()

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        """The engine's cumulative prefix-cache counters from /metrics, by the one rule (`cache_stats_of`)."""
        with unsupported_when_rejected(box, self.metrics_off_hint):
            samples = await self._metrics(box)
        return cache_stats_of(box, self.engine_kind, samples)

    async def _health_answer(self, box: BoxSpec) -> HealthAnswer:
        return await self._http.health_answer(box, "/health")

    async def health(self, box: BoxSpec) -> bool:
        """Up only on 200; every answer feeds the restart watch (a down/up bounce is a new epoch). A box
        that takes the connection but answers too late raises `EngineSlow` and is not seen as down; any
        other failure raises `EngineDown` saying how it failed."""
        answer = await self._health_answer(box)
        if answer.timed_out:
            raise EngineSlow(box.id, answer.detail)
        up = answer.status == 200
        self._watch.saw_health(box.id, up)
        if not up:
            raise answer.down(box)
        return True

    async def _metrics(self, box: BoxSpec) -> list[Sample]:
        """The parsed /metrics samples; a 4xx (metrics switched off) comes out as EngineRejected."""
        text = await self._http.get_text(box, "/metrics", time_limit=self._http.timeouts.health)
        return parse_metrics(box, text)

    async def _metrics_if_exposed(self, box: BoxSpec) -> list[Sample] | None:
        """The parsed /metrics samples, or None when the server rejects the route (metrics are off)."""
        try:
            return await self._metrics(box)
        except EngineRejected:
            return None

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        """Unknown unless the engine says: placement then relies on the box's configured limits."""
        return BoxCapacity(source="not reported by this engine")

    async def _process_start(self, box: BoxSpec) -> float | None:
        samples = await self._metrics_if_exposed(box)
        return None if samples is None else process_start_time(samples)

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        """Nothing reported by default (llama.cpp reuses any common token prefix; a generic server is
        unknown): the profile's `block_tokens` applies."""
        return CacheLayout()

    @abstractmethod
    async def _prompt_for(self, box: BoxSpec, prefix: Prefix, suffix: str) -> str | PromptT:
        """The prompt that puts exactly `prefix` (then `suffix`) in front of the engine's cache."""

    @abstractmethod
    async def _complete(
        self,
        box: BoxSpec,
        prompt: str | PromptT,
        *,
        max_tokens: int,
        temperature: float,
        json_schema: dict[str, object] | None = None,
        time_limit: float | None = None,
    ) -> CompletionReport:
        """One non-streamed completion, parsed into a checked CompletionReport."""

    async def complete_prefix(
        self,
        box: BoxSpec,
        prefix: Prefix,
        *,
        suffix: str = "",
        max_tokens: int = 1,
        slot: int | None = None,
        rank: int | None = None,
    ) -> CompletionReport:
        prompt = await self._prompt_for(box, prefix, suffix)
        return await self._complete_greedy(box, prompt, max_tokens=max_tokens, rank=rank)

    async def _complete_greedy(
        self, box: BoxSpec, prompt: str | PromptT, *, max_tokens: int, rank: int | None
    ) -> CompletionReport:
        """A warm's completion; an engine that can name a data-parallel rank overrides this."""
        if rank is not None:
            raise NotSupported(box.id, f"{type(self).__name__} cannot pin a data-parallel rank")
        return await self._complete(box, prompt, max_tokens=max_tokens, temperature=0.0)

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        return await self._complete(
            box,
            prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            json_schema=json_schema,
            time_limit=self._http.timeouts.long_request,
        )
