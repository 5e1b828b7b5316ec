"""SglangRouterGateway against the REAL sglang-router (PyPI wheel, runs on CPU) and real llama-server boxes.

The router starts with no workers. A box the gateway registers gets the router's traffic; a box it
deregisters gets none, including across a restart of that box. Which box served a request is read from
the boxes' own `/metrics` counters (llama-server `--metrics`): prompt tokens processed + cached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testbed.fleet import LlamaBox, LlamaFleet
from tests.integration.router_harness import running_router
from warmer.adapters.gateway.sglang_router import SglangRouterGateway
from warmer.core.hitrate import cache_stats_from_metrics
from warmer.core.model import BoxSpec, EngineKind

pytestmark = pytest.mark.integration

FleetFactory = Callable[..., LlamaFleet]


@pytest.fixture
def router_url(tmp_path: Path) -> Iterator[str]:
    """A real sglang-router on a free loopback port, with no initial workers; stopped by PID."""
    with running_router(tmp_path / "sglang-router.log") as router:
        yield router.url


def spec(box: LlamaBox) -> BoxSpec:
    return BoxSpec(id=box.id, base_url=box.base_url, engine=EngineKind.LLAMACPP, model="tiny")


def prompt_tokens_seen(box: LlamaBox) -> float:
    """Every prompt token the box has looked at (computed + reused): grows with each request it serves."""
    text = httpx.get(f"{box.base_url}/metrics", timeout=10.0).text
    stats = cache_stats_from_metrics(EngineKind.LLAMACPP, text)
    assert stats.queried_tokens is not None
    return stats.queried_tokens


async def complete_via_router(client: httpx.AsyncClient, router: str, prompt: str) -> httpx.Response:
    # the router's OpenAI request type requires `model`; llama-server serves its one model whatever the name
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0}
    return await client.post(f"{router}/v1/completions", json=body, timeout=120.0)


def test_router_routes_only_to_registered_boxes(router_url: str, llama_fleet_factory: FleetFactory) -> None:
    async def scenario() -> None:
        fleet = llama_fleet_factory(2)
        first, second = fleet.boxes
        async with httpx.AsyncClient() as client:
            gateway = SglangRouterGateway(client, router_url, settle_timeout=60)
            assert await gateway.registered() == set()

            await gateway.register(spec(first))
            assert gateway.api_style == "workers"  # 0.3.2 serves only the /workers API
            assert await gateway.registered() == {first.base_url}

            before = (prompt_tokens_seen(first), prompt_tokens_seen(second))
            for i in range(3):
                response = await complete_via_router(client, router_url, f"Call {i}: hello, who is this?")
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0]["text"] is not None
            after = (prompt_tokens_seen(first), prompt_tokens_seen(second))
            assert after[0] > before[0], "the registered box served the requests"
            assert after[1] == before[1], "the unregistered box got nothing"

            # swap: second in, first out -> everything goes to the second box
            await gateway.register(spec(second))
            await gateway.deregister(spec(first))
            assert await gateway.registered() == {second.base_url}
            before = (prompt_tokens_seen(first), prompt_tokens_seen(second))
            for i in range(3):
                response = await complete_via_router(client, router_url, f"Call {i}: still there?")
                assert response.status_code == 200, response.text
            after = (prompt_tokens_seen(first), prompt_tokens_seen(second))
            assert after[0] == before[0], "a deregistered box gets no traffic"
            assert after[1] > before[1]

            # a restarted box stays out until it is registered again (warmer does that once it is ready)
            fleet.restart(first.id)
            restarted = fleet.box(first.id)
            before_first = prompt_tokens_seen(restarted)
            for i in range(2):
                assert (await complete_via_router(client, router_url, f"Restart {i}")).status_code == 200
            assert prompt_tokens_seen(restarted) == before_first
            await gateway.register(spec(restarted))
            await gateway.deregister(spec(second))
            assert await gateway.registered() == {restarted.base_url}
            assert (await complete_via_router(client, router_url, "Back in service")).status_code == 200
            assert prompt_tokens_seen(restarted) > before_first

            # nothing registered: the router has nowhere to send a request
            await gateway.deregister(spec(restarted))
            assert await gateway.registered() == set()
            seen = (prompt_tokens_seen(restarted), prompt_tokens_seen(second))
            response = await complete_via_router(client, router_url, "Anyone?")
            assert response.status_code >= 500
            assert (prompt_tokens_seen(restarted), prompt_tokens_seen(second)) == seen

    asyncio.run(scenario())


def test_router_readmits_a_restarted_box_on_its_own_and_takes_runtime_type_silently(
    router_url: str, llama_fleet_factory: FleetFactory
) -> None:
    """What the real 0.3.2 router does that decides how warmer keeps a cold box out (see the gateway
    adapter's docstring): a duplicate add is 202 (not smg's 409) and changes nothing, `runtime_type` is
    accepted and ignored, and a registered box that restarts gets traffic again without any call from
    warmer, which is why gateway sync withdraws a box the moment it stops being ready."""

    async def scenario() -> None:
        fleet = llama_fleet_factory(2)
        first, second = fleet.boxes
        async with httpx.AsyncClient() as client:
            gateway = SglangRouterGateway(client, router_url, settle_timeout=60)
            await gateway.register(spec(first))

            duplicate = await client.post(f"{router_url}/workers", json={"url": first.base_url}, timeout=10)
            assert duplicate.status_code == 202
            with_runtime = {"url": second.base_url, "runtime_type": "sglang"}
            assert (
                await client.post(f"{router_url}/workers", json=with_runtime, timeout=10)
            ).status_code == 202
            deadline = asyncio.get_running_loop().time() + 60
            while await gateway.registered() != {first.base_url, second.base_url}:
                assert asyncio.get_running_loop().time() < deadline, "the second add never landed"
                await asyncio.sleep(0.2)
            listing = (await client.get(f"{router_url}/workers", timeout=10)).json()["workers"]
            assert len(listing) == 2  # the duplicate add did not create a second worker
            assert all("runtime_type" not in entry for entry in listing)
            await gateway.deregister(spec(second))

            # Stop and start the registered box behind the router's back: the router notices the failed
            # health checks, then re-admits the box as soon as /health passes again.
            fleet.restart(first.id)
            restarted = fleet.box(first.id)
            assert restarted.base_url == first.base_url
            before = prompt_tokens_seen(restarted)
            response = None
            for _ in range(100):
                response = await complete_via_router(client, router_url, "Are you back?")
                if response.status_code == 200:
                    break
                await asyncio.sleep(0.2)
            assert response is not None
            assert response.status_code == 200, response.text
            assert prompt_tokens_seen(restarted) > before, "the router routed to the restarted (cold) box"

    asyncio.run(scenario())
