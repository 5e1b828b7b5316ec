"""`warmer serve` keeping an agent warm on a hosted box, and stopping, by the cost rule.

The box is Anthropic's Messages API as the local provider server answers it (`testbed.hosted_provider`, the
documented cache rules on loopback). Its profile is a fast copy of `claude-sonnet-4.5` (same prices and
floor; a 2-s touch inside a 3-s lifetime) so a keepalive is seen within seconds. The agent's volume comes
from a campaign: 10 calls a minute, where touching costs less than the misses it saves (the rule in
`warmer.core.hosted`), so the daemon warms the prefix, verifies it by the provider's usage, routes it and
touches it; once the campaign is cancelled no call is expected, touching would only cost, and the daemon
lets the prefix go and takes it out of the routes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testbed.fleet import free_loopback_port
from testbed.hosted_provider import HostedProvider, ProviderRules, hosted_provider
from tests.integration.daemon_harness import AGENT, MODELS_DIR, Serve, clean_env, running_serve, write_config

KEY = "sk-local-daemon-key-3131"
KEY_ENV = "HOSTED_PROVIDER_TEST_KEY"  # not WARMER_*: the harness strips those from serve's environment
SERVING_STATES = {"warm", "stale", "warming"}


def fast_profile(models: Path) -> None:
    """claude-sonnet-4.5 with a 2-s keepalive inside a 3-s lifetime (the provider's virtual clock stands
    still, so its own entries outlive the test; the lifetime here is what the daemon plans with)."""
    text = (MODELS_DIR / "claude-sonnet-4.5.toml").read_text()
    text = text.replace("keepalive_seconds = 240.0", "keepalive_seconds = 2.0")
    text = text.replace("lifetime_seconds = 300.0", "lifetime_seconds = 3.0")
    text = text.replace(
        'tokenizer_file = "tiny-demo.tokenizer.json"',
        f'tokenizer_file = "{MODELS_DIR}/tiny-demo.tokenizer.json"',
    )
    (models / "hosted-fast.toml").write_text(text)


def write_hosted_config(tmp_path: Path, provider: HostedProvider, port: int) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    fast_profile(models)
    box = (
        f'[[fleet.boxes]]\nid = "anthropic"\nbase_url = "{provider.base_url}"\nengine = "anthropic"\n'
        f'model = "hosted-fast"\napi_key_env = "{KEY_ENV}"\n'
    )
    return write_config(tmp_path, (), port, fleet_extra=box, models_dir=models, model="hosted-fast")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Serve, HostedProvider]]:
    with hosted_provider(ProviderRules(api_key=KEY)) as provider:
        port = free_loopback_port()
        config = write_hosted_config(tmp_path, provider, port)
        env = clean_env(**{KEY_ENV: KEY})
        with running_serve(config, port, tmp_path / "serve.log", env) as serve:
            yield serve, provider


def states(serve: Serve) -> set[str]:
    return {p["state"] for p in serve.box("anthropic")["prefixes"]}


def routed(serve: Serve) -> list[str]:
    entry = serve.routes().get(AGENT)
    return [] if entry is None else [route["box_id"] for route in entry["routes"]]


def test_daemon_keeps_a_hosted_prefix_warm_while_it_pays_and_lets_it_go_when_it_does_not(
    daemon: tuple[Serve, HostedProvider],
) -> None:
    serve, provider = daemon
    serve.wait("the hosted box ready", lambda: serve.is_ready("anthropic"), 60.0)
    # No calls expected yet (no campaign, no pre-call ask): warming would only cost, so nothing is sent.
    assert provider.requests == []
    assert routed(serve) == []

    now = time.time()
    body = {"agent": AGENT, "starts_at": now, "ends_at": now + 3600, "expected_calls": 600}  # 10 calls/min
    put = httpx.put(f"{serve.base_url}/v1/campaigns/peak", json=body, timeout=10)
    assert put.status_code == 201, put.text

    serve.wait("the agent routed on the hosted box", lambda: routed(serve) == ["anthropic"], 60.0)
    assert states(serve) & SERVING_STATES
    first = provider.requests[0]["body"]
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    assert first["messages"] == [{"role": "user", "content": "."}]
    verified_after = len(provider.requests)

    # Kept: keepalive touches reach the provider and read the prefix the warm wrote.
    serve.wait("two keepalive touches", lambda: len(provider.requests) >= verified_after + 2, 60.0)
    assert "ephemeral" in str(provider.requests[-1]["body"]["system"])

    # No calls expected any more: touching would cost more than the misses it saves, so it is let go.
    assert httpx.delete(f"{serve.base_url}/v1/campaigns/peak", timeout=10).status_code == 204
    serve.wait(
        "the prefix let go and out of the routes",
        lambda: routed(serve) == [] and not states(serve) & SERVING_STATES,
        60.0,
    )
