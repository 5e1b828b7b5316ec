"""Engine control reads go to a connection pool of their own (`ControlPool`), so a health poll never waits
for a connection the fleet's warm-ups hold; everything else goes to the work pool. The engine client the
root builds splits them so."""

from __future__ import annotations

import asyncio

import httpx

from warmer.adapters.engines.http import ControlPool, control_request
from warmer.config.settings import Settings
from warmer.root.engines import engine_http_client


def recorder(seen: list[str], name: str) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{name} {request.url.path}")
        return httpx.Response(200, text="ok")

    return httpx.MockTransport(answer)


def test_control_reads_and_work_use_separate_pools() -> None:
    seen: list[str] = []
    pools = ControlPool(control=recorder(seen, "control"), work=recorder(seen, "work"))

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=pools) as client:
            with control_request("health"):
                await client.get("http://box-1/health")
            await client.post("http://box-1/completion")
            with control_request("capacity"):
                await client.get("http://box-1/props")

    asyncio.run(scenario())
    assert seen == ["control /health", "work /completion", "control /props"]


def test_the_engine_client_splits_its_pools_unless_a_transport_is_given() -> None:
    async def scenario() -> None:
        async with engine_http_client(Settings()) as client:
            assert isinstance(client._transport, ControlPool)
        given = recorder([], "given")
        async with engine_http_client(Settings(), transport=given) as client:
            assert client._transport is given

    asyncio.run(scenario())
