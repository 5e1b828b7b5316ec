"""One EnginePort for the whole fleet: delegates on `box.engine`, and calls only registered boxes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from warmer.adapters.engines.http import control_request
from warmer.core.errors import EngineError, NotSupported
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    CompletionReport,
    EngineKind,
    Prefix,
)
from warmer.ports import EnginePort


class EngineDispatcher:
    """EnginePort that routes each call to the adapter for the box's engine kind.

    Control reads (health, epoch, capacity, metrics) run inside `control_request`, so every HTTP request
    they send counts in `warmer_engine_control_requests_total` (`count_control_requests`).

    Warm traffic is bounded per box by the box's warm budget where the reconciler runs it
    (`PlannerConfig.budget_for`), not here: one bound, so a box's budget is what it gets.

    With `boxes` given, only those boxes (same id and base URL) are ever called: the daemon talks only to
    engines registered in its fleet.
    """

    def __init__(
        self,
        engines: Mapping[EngineKind, EnginePort],
        *,
        boxes: Iterable[BoxSpec] | None = None,
    ) -> None:
        self._engines = dict(engines)
        self._registered: dict[str, str] | None = None
        if boxes is not None:
            self.register(boxes)

    def register(self, boxes: Iterable[BoxSpec]) -> None:
        """Replace the set of boxes this dispatcher may call (e.g. after a config reload)."""
        self._registered = {box.id: box.base_url for box in boxes}

    def _engine(self, box: BoxSpec) -> EnginePort:
        if self._registered is not None and self._registered.get(box.id) != box.base_url:
            raise EngineError(box.id, f"box {box.id!r} at {box.base_url!r} is not registered in the fleet")
        try:
            return self._engines[box.engine]
        except KeyError:
            raise NotSupported(
                box.id, f"no adapter configured for engine kind {box.engine.value!r}"
            ) from None

    async def health(self, box: BoxSpec) -> bool:
        with control_request("health"):
            return await self._engine(box).health(box)

    async def epoch(self, box: BoxSpec) -> str:
        with control_request("epoch"):
            return await self._engine(box).epoch(box)

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
        engine = self._engine(box)
        if rank is None:
            return await engine.complete_prefix(box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot)
        return await engine.complete_prefix(
            box, prefix, suffix=suffix, max_tokens=max_tokens, slot=slot, rank=rank
        )

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        return await self._engine(box).complete_prompt(
            box, prompt, max_tokens=max_tokens, temperature=temperature, json_schema=json_schema
        )

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        return await self._engine(box).render_chat(box, messages, tools)

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        return await self._engine(box).tokenize(box, text)

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        with control_request("metrics"):
            return await self._engine(box).cache_stats(box)

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        return await self._engine(box).cache_layout(box)

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        with control_request("capacity"):
            return await self._engine(box).capacity(box)
