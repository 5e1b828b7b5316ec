"""How much warming a box may take: requests in flight and uncached tokens per second (a token bucket).

The planner spends from a box's bucket for every warm and probe it plans; a cost larger than the whole
bucket is allowed only from a full bucket, so big prefixes still get warmed and the long-run rate holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """Uncached-token budget of one box: `tokens` available as of `updated_at` (may be negative = debt)."""

    tokens: float
    updated_at: float


@dataclass(frozen=True, slots=True)
class WarmBudget:
    max_concurrent: int = 2  # warm/probe requests in flight on one box
    tokens_per_second: float = 2000.0  # uncached prompt tokens per second spent on warming, on average
    burst_tokens: float = 20000.0  # bucket size

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        if self.tokens_per_second <= 0:
            raise ValueError("tokens_per_second must be > 0")
        if self.burst_tokens <= 0:
            raise ValueError("burst_tokens must be > 0")


def refill(bucket: TokenBucket | None, budget: WarmBudget, now: float) -> TokenBucket:
    """The bucket as of `now`: it fills at the budget's rate up to its size (a missing bucket is full)."""
    if bucket is None:
        return TokenBucket(tokens=budget.burst_tokens, updated_at=now)
    elapsed = max(0.0, now - bucket.updated_at)
    tokens = min(budget.burst_tokens, bucket.tokens + elapsed * budget.tokens_per_second)
    return TokenBucket(tokens=tokens, updated_at=max(now, bucket.updated_at))


def try_spend(bucket: TokenBucket, cost: float, budget: WarmBudget) -> TokenBucket | None:
    """Charge `cost` uncached tokens, or None when the budget cannot afford it now.

    A cost larger than the whole bucket is allowed only from a full bucket, leaving debt that later refill
    pays off: big prefixes still get warmed, and the long-run rate still holds.
    """
    if cost <= bucket.tokens or bucket.tokens >= budget.burst_tokens:
        return replace(bucket, tokens=bucket.tokens - cost)
    return None
