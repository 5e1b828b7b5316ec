"""The one place HTTP clients are made: every client warmer opens (engines and the gateway, Kubernetes
discovery, the CLI's scrapes and daemon queries) shares these settings, so none of them differs by accident.

- `trust_env=False`: warmer talks to its own fleet, the API server and its own daemon by address; a proxy or
  CA bundle taken from the environment would put a third party in between or change what is trusted.
- No redirects: a box answers at its registered URL or not at all, never where a redirect points.
- Bounded connection pool and a timeout on every client; callers pass the timeout their settings give.
- One user agent, so engine and API-server logs name warmer and its version.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

import warmer

USER_AGENT = f"warmer/{warmer.__version__}"
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=30.0)
# One box's control reads (health and epoch together, capacity, metrics): a pool per box, kept open between
# polls (`warmer.adapters.engines.http.PoolPerOrigin`).
BOX_CONTROL_LIMITS = httpx.Limits(max_connections=8, max_keepalive_connections=4, keepalive_expiry=30.0)
DEFAULT_TIMEOUT = httpx.Timeout(10.0)


def _headers(headers: Mapping[str, str] | None) -> dict[str, str]:
    return {"user-agent": USER_AGENT, **(headers or {})}


def http_client(
    *,
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    verify: str | bool = True,
    base_url: str = "",
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An async client with the shared settings. `verify` is a CA bundle path or a bool, never the
    environment's; `transport` replaces the network in tests."""
    return httpx.AsyncClient(
        timeout=timeout,
        verify=verify,
        base_url=base_url,
        headers=_headers(headers),
        transport=transport,
        limits=LIMITS,
        follow_redirects=False,
        trust_env=False,
    )


def pooled_transport(*, verify: str | bool = True, limits: httpx.Limits = LIMITS) -> httpx.AsyncHTTPTransport:
    """A connection pool with the shared settings, for a client that splits its traffic over several
    (`warmer.adapters.engines.http.ControlPool`); `limits` for a pool of one box's (`BOX_CONTROL_LIMITS`)."""
    return httpx.AsyncHTTPTransport(verify=verify, limits=limits, trust_env=False)


def sync_http_client(
    *,
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    base_url: str = "",
    headers: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """The blocking twin for one-off CLI commands, with the same settings."""
    return httpx.Client(
        timeout=timeout,
        base_url=base_url,
        headers=_headers(headers),
        transport=transport,
        limits=LIMITS,
        follow_redirects=False,
        trust_env=False,
    )
