"""What engines say about their caches on their own: KV cache events, hit-rate counters."""
