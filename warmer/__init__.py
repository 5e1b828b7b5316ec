"""warmer: keeps LLM prompt prefixes warm in engine KV caches; traffic reaches a box only once it is warm."""

__version__ = "0.1.0"
