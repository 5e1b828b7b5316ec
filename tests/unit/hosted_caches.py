"""Provider cache rules the hosted tests share, with the figures of the shipped profiles."""

from __future__ import annotations

from warmer.core.hosted import ProviderCache

# Claude Sonnet 4.5: $3 base input, $3.75 a 5-minute write (1.25x), $0.30 a read (0.1x), per million tokens.
SONNET = ProviderCache(
    min_cacheable_tokens=1024,
    increment_tokens=1,
    lifetime_seconds=300.0,
    input_price=3.0,
    cache_write_price=3.75,
    cache_read_price=0.3,
    ttl="5m",
)
# GPT-4.1: $2 input, writes at the input price (no surcharge before GPT-5.6), $0.50 cached, 128-token hits.
GPT = ProviderCache(
    min_cacheable_tokens=1024,
    increment_tokens=128,
    lifetime_seconds=300.0,
    input_price=2.0,
    cache_write_price=2.0,
    cache_read_price=0.5,
)
