"""A box's failed health poll says how it failed — refused, no answer in time, an HTTP status — in
/v1/boxes (`health_error_kind`, `health_error`) and in the log at every change, including a box that was
never up (an unreachable box used to be silent)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from tests.unit.reconciler_fakes import FakeEngine, settle, world
from warmer.adapters.engines.llamacpp import LlamaCppEngine
from warmer.cli.status import health_cell
from warmer.core.errors import EngineDown, EngineSlow, HealthFailure
from warmer.core.model import BoxCapacity, BoxSpec, EngineKind, EngineTimeouts
from warmer.core.promtext import parse_prometheus_text
from warmer.root.metrics import Metrics
from warmer.service.views.status import StatusService


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def _server(answer: bytes | None) -> AsyncIterator[int]:
    """A loopback HTTP server that answers every request with `answer`, or takes the connection and
    never answers (None)."""
    hold = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            await hold.wait()
        else:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        hold.set()
        server.close()
        await server.wait_closed()


def _box(port: int) -> BoxSpec:
    return BoxSpec(id="b1", base_url=f"http://127.0.0.1:{port}", engine=EngineKind.LLAMACPP, model="m")


async def _poll(port: int) -> bool:
    async with httpx.AsyncClient() as client:
        engine = LlamaCppEngine(client, timeouts=EngineTimeouts(connect=1.0, health=0.5))
        return await engine.health(_box(port))


def test_a_refused_connection_is_told_apart_from_a_status_and_a_late_answer() -> None:
    async def scenario() -> None:
        with pytest.raises(EngineDown, match="connection refused") as refused:
            await _poll(_free_port())
        assert refused.value.kind is HealthFailure.REFUSED

        loading = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 13\r\n\r\nLoading model"
        async with _server(loading) as port:
            with pytest.raises(EngineDown, match="answered 503: Loading model") as status:
                await _poll(port)
        assert status.value.kind is HealthFailure.HTTP_STATUS

        async with _server(None) as port:
            with pytest.raises(EngineSlow, match=r"timed out after 0\.5s"):
                await _poll(port)

        ok = b'HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'
        async with _server(ok) as port:
            assert await _poll(port) is True

    asyncio.run(scenario())


class FailingHealthEngine(FakeEngine):
    """The fake engine, except that each box's health answers with the next failure of its script
    (None: up)."""

    def __init__(self, box_ids: tuple[str, ...]) -> None:
        super().__init__(box_ids)
        self.failures: dict[str, Iterator[Callable[[str], Exception] | None]] = {}

    async def health(self, box: BoxSpec) -> bool:
        script = self.failures.get(box.id)
        failure = next(script, None) if script is not None else None
        if failure is not None:
            raise failure(box.id)
        return await super().health(box)

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        return replace(await super().capacity(box), version="b4200-abc")


def _refused(box_id: str) -> Exception:
    return EngineDown(box_id, HealthFailure.REFUSED, "GET /health: connection refused")


def _loading(box_id: str) -> Exception:
    return EngineDown(box_id, HealthFailure.HTTP_STATUS, "GET /health answered 503: Loading model")


def _late(box_id: str) -> Exception:
    return EngineSlow(box_id, "GET /health timed out after 3s")


def test_each_change_of_why_a_box_is_down_is_in_the_view_and_the_log(store_url: str) -> None:
    async def scenario() -> list[tuple[str | None, str | None, list[tuple[str, object]]]]:
        engine = FailingHealthEngine(("b1",))
        engine.failures["b1"] = iter([_refused, _refused, _loading, _late, None])
        w = world(store_url, box_ids=("b1",), engine=engine)
        status = StatusService(w.reconciler, w.store)
        seen = []
        for _ in range(5):
            with capture_logs() as logs:
                await settle(w.reconciler, rounds=0)
            (view,) = await status.boxes()
            events = [(entry["event"], entry.get("kind")) for entry in logs if entry.get("box") == "b1"]
            seen.append((view.health_error_kind, view.health_error, events))
        await w.reconciler.close()
        await w.store.close()
        return seen

    seen = asyncio.run(scenario())
    refused, refused_again, loading, late, up = seen
    assert refused == (
        "refused",
        "b1: GET /health: connection refused",
        [("box unhealthy", HealthFailure.REFUSED)],
    ), "a box that was never up is in the log from its first failed poll"
    assert refused_again[:2] == refused[:2]
    assert ("box unhealthy", HealthFailure.REFUSED) not in refused_again[2], "the same failure: no new line"
    assert loading[:2] == ("http_status", "b1: GET /health answered 503: Loading model")
    assert ("box unhealthy", HealthFailure.HTTP_STATUS) in loading[2]
    assert late[0] == "timeout"
    assert ("box unhealthy", HealthFailure.TIMEOUT) in late[2]
    assert up[:2] == (None, None)


def test_warmer_status_says_how_a_box_is_down() -> None:
    box = {"id": "b1", "healthy": False, "health_error_kind": "refused", "health_slow_polls": 0}
    assert health_cell(box) == "DOWN (refused)"
    assert health_cell({**box, "health_error_kind": None}) == "DOWN"


def _samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(dict(sample.labels).items())): sample.value
        for sample in parse_prometheus_text(generate_latest(metrics.registry).decode())
        if sample.name == name
    }


def test_the_health_gauge_and_failure_kind_follow_each_poll_and_the_info_names_the_box(
    store_url: str,
) -> None:
    async def scenario() -> list[tuple[dict[Any, float], dict[Any, float], dict[Any, float]]]:
        metrics = Metrics()
        engine = FailingHealthEngine(("b1",))
        engine.failures["b1"] = iter([_refused, _loading, None])
        w = world(store_url, box_ids=("b1",), engine=engine, observer=metrics.reconcile)
        seen = []
        for _ in range(3):
            await settle(w.reconciler, rounds=0)
            seen.append(
                (
                    _samples(metrics, "warmer_box_healthy"),
                    _samples(metrics, "warmer_box_health_failure"),
                    _samples(metrics, "warmer_box_info"),
                )
            )
        await w.reconciler.close()
        await w.store.close()
        return seen

    (refused, loading, up) = asyncio.run(scenario())
    assert refused[0] == {(("box", "b1"),): 0}
    assert refused[1] == {(("box", "b1"), ("kind", "refused")): 1}
    assert loading[1] == {(("box", "b1"), ("kind", "http_status")): 1}, "the refused series is gone"
    assert up[0] == {(("box", "b1"),): 1}
    assert up[1] == {}
    (info,) = up[2]
    assert dict(info) == {
        "box": "b1",
        "engine": "llamacpp",
        "model": "m",
        "group": "",
        "version": "b4200-abc",
    }
