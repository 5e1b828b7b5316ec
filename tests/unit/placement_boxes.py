"""Boxes for the placement property tests: only what placement reads (id, model, the two cache caps)."""

from __future__ import annotations

from warmer.core.model import BoxSpec, EngineKind


def box(i: int, model: str, tokens: int | None, prefixes: int | None) -> BoxSpec:
    return BoxSpec(
        id=f"b{i}",
        base_url="http://x",
        engine=EngineKind.VLLM,
        model=model,
        cache_capacity_tokens=tokens,
        prefix_capacity=prefixes,
    )
