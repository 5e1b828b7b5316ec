"""Engine control reads go to a connection pool of their own (`ControlPool`), so a health poll never waits
for a connection the fleet's warm-ups hold; everything else goes to the work pool. The engine client the
root builds splits them so."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from warmer.adapters.engines.http import ControlPool, PoolPerOrigin, control_request
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


class CountingPool(httpx.AsyncBaseTransport):
    """A pool the per-origin transport made: which requests it got, whether it was closed."""

    def __init__(self, made: list[CountingPool]) -> None:
        self.hosts: list[str] = []
        self.closed = False
        made.append(self)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(f"{request.url.host}:{request.url.port}")
        return httpx.Response(200, text="ok")

    async def aclose(self) -> None:
        self.closed = True


def test_control_reads_get_a_pool_per_box_kept_across_polls() -> None:
    """One pool per origin (a box): httpcore scans every connection of a pool on each request, so a
    fleet-wide pool costs a request O(boxes); per box it scans its own box's few connections."""
    made: list[CountingPool] = []
    pools = PoolPerOrigin(lambda: CountingPool(made))

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=pools) as client:
            for _ in range(2):  # two poll rounds
                for box in ("http://box-1:8080", "http://box-2:8080", "http://box-1:8081"):
                    await client.get(f"{box}/health")
                    await client.get(f"{box}/props")
            assert pools.pool_count() == 3

    asyncio.run(scenario())
    assert [pool.hosts for pool in made] == [
        ["box-1:8080"] * 4,
        ["box-2:8080"] * 4,
        ["box-1:8081"] * 4,
    ]
    assert all(pool.closed for pool in made)  # closing the client closes every box's pool
    assert pools.pool_count() == 0


def test_closing_goes_on_past_a_pool_that_fails_to_close() -> None:
    made: list[CountingPool] = []

    class Failing(CountingPool):
        async def aclose(self) -> None:
            raise OSError("socket already gone")

    factories = iter([lambda: Failing(made), lambda: CountingPool(made)])
    pools = PoolPerOrigin(lambda: next(factories)())

    async def scenario() -> None:
        client = httpx.AsyncClient(transport=pools)
        await client.get("http://box-1/health")
        await client.get("http://box-2/health")
        with pytest.raises(OSError, match="already gone"):
            await client.aclose()

    asyncio.run(scenario())
    assert made[1].closed


def test_the_engine_client_polls_each_box_on_its_own_pool() -> None:
    async def scenario() -> None:
        async with engine_http_client(Settings()) as client:
            transport = client._transport
            assert isinstance(transport, ControlPool)
            assert isinstance(transport._control, PoolPerOrigin)
            assert isinstance(transport._work, httpx.AsyncHTTPTransport)

    asyncio.run(scenario())


def test_a_box_no_longer_asked_has_its_pool_closed_once_idle() -> None:
    """A box that left the fleet (discovery replaced its pod) is never asked again: its pool and the
    connections it keeps are closed once it has been unused for `idle_seconds`; live boxes keep theirs."""
    made: list[CountingPool] = []
    now = {"t": 0.0}
    pools = PoolPerOrigin(lambda: CountingPool(made), idle_seconds=300.0, monotonic=lambda: now["t"])

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=pools) as client:
            await client.get("http://gone:8080/health")
            for _ in range(70):  # the live box is polled every 5 s; the other box left
                now["t"] += 5.0
                await client.get("http://live:8080/health")
            assert pools.pool_count() == 1
            assert made[0].closed  # gone:8080's pool
            assert not made[1].closed  # live:8080's
            await client.get("http://gone:8080/health")  # back: a new pool
            assert pools.pool_count() == 2

    asyncio.run(scenario())
    assert len(made) == 3
