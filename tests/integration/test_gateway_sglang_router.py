"""SglangRouterGateway against the REAL sglang-router (PyPI wheel, runs on CPU) and real llama-server boxes.

The router starts with no workers. A box the gateway registers gets the router's traffic; a box it
deregisters gets none, including across a restart of that box. Which box served a request is read from
the boxes' own `/metrics` counters (llama-server `--metrics`): prompt tokens processed + cached.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testbed.fleet import LlamaBox, LlamaFleet
from tests.integration.router_harness import running_router
from warmer.adapters.gateway.sglang_router import SglangRouterGateway
from warmer.core.hitrate import cache_stats_from_metrics
from warmer.core.model import BoxSpec, EngineKind
from warmer.service.fleet.gateway_sync import GatewaySync

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


class _Ready:
    def __init__(self, ready: set[str]) -> None:
        self.ready = ready

    def ready_box_ids(self) -> set[str] | None:
        return set(self.ready)

    async def wait_changed(self) -> None:
        await asyncio.Event().wait()


class _Clock:
    def now(self) -> float:
        return 0.0

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def test_an_unhealthy_registration_of_a_ready_box_is_replaced_and_a_box_not_ready_withdrawn(
    tmp_path: Path, llama_fleet_factory: FleetFactory
) -> None:
    """Listed is not routed. sglang-router 0.3.2 keeps a worker whose health checks failed in its list with
    `"is_healthy": false` and sends it nothing until `--health-success-threshold` checks pass again (here
    set high, as a cautious operator might, so it stays out for the whole test). Gateway sync replaces
    such a registration of a box warmer calls ready (it gets traffic at once) and withdraws a box that is
    not ready whatever the router shows. 0.3.2 has no `--remove-unhealthy-workers` (checked below), so
    the router is run the one way it can be."""
    help_text = subprocess.run(
        [sys.executable, "-m", "sglang_router.launch_router", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "--health-success-threshold" in help_text
    assert "--remove-unhealthy-workers" not in help_text  # a newer wheel: run this test with it on too

    async def scenario(router_url: str) -> None:
        fleet = llama_fleet_factory(2)
        first, second = fleet.boxes
        boxes = [spec(first), spec(second)]
        readiness = _Ready({first.id, second.id})
        async with httpx.AsyncClient() as client:
            gateway = SglangRouterGateway(client, router_url, settle_timeout=60)
            sync = GatewaySync(
                gateway=gateway, fleet=lambda: boxes, readiness=readiness, clock=_Clock(), interval_seconds=60
            )
            assert sorted((await sync.sync_once()).registered) == sorted([first.id, second.id])
            assert await gateway.listing() == {first.base_url: True, second.base_url: True}

            for box in (first, second):  # both go down behind the router's back, then come back
                fleet.kill(box.id)
            deadline = asyncio.get_running_loop().time() + 60
            while set((await gateway.listing()).values()) != {False}:
                assert asyncio.get_running_loop().time() < deadline, "the router never saw them fail"
                await asyncio.sleep(0.2)
            for box in (first, second):
                fleet.restart(box.id)
            assert await gateway.listing() == {first.base_url: False, second.base_url: False}
            refused = await complete_via_router(client, router_url, "Anyone there?")
            assert refused.status_code >= 500  # listed, healthy again, and still not routed

            readiness.ready = {first.id}  # the first is ready (warm again); the second is not
            report = await sync.sync_once()
            assert (report.registered, report.deregistered, report.failed) == ((first.id,), (second.id,), ())
            assert await gateway.listing() == {first.base_url: True}
            before = prompt_tokens_seen(fleet.box(first.id))
            response = await complete_via_router(client, router_url, "Back in service?")
            assert response.status_code == 200, response.text
            assert prompt_tokens_seen(fleet.box(first.id)) > before

    extra = ["--health-failure-threshold", "1", "--health-success-threshold", "100000"]
    with running_router(tmp_path / "sglang-router.log", extra) as router:
        asyncio.run(scenario(router.url))
