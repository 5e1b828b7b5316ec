"""What every settings section shares: unknown keys are errors, and one rule for HTTP(S) URLs."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Every section rejects unknown keys: a typo must be an error, not a silently ignored setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def http_url(value: str, what: str) -> str:
    """An absolute http(s) URL with a host, without a trailing slash (paths are appended to it)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{what} must be an absolute http:// or https:// URL with a host, got {value!r}")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} must not carry a query or fragment, got {value!r}")
    return value.rstrip("/")
