"""The pre-call front door: `POST /v1/prewarm` is answered ahead of FastAPI's stack, exactly as the documented
route answers it, counted in the request metrics under its route template, and an answer's cached JSON
never outlives the answer; the server stack follows the `[api]` settings."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
import uvloop
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.unit.reconciler_fakes import FakeClock
from tests.unit.test_prewarm import TOKEN, Answer, FakeBackend
from warmer.api import ApiServices, Readiness, create_app
from warmer.api import prewarm as prewarm_api
from warmer.config.server_settings import ApiSettings
from warmer.core.model import WarmState
from warmer.core.readiness import Route
from warmer.root.metrics import Metrics
from warmer.root.server import api_server, run_daemon_loop
from warmer.service.dialer.prewarm import PrewarmService

AUTH = {"authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}


async def _ready() -> Readiness:
    return Readiness(True)


class Requests:
    """A RequestObserver that keeps what it was told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, int]] = []

    def request_finished(self, route: str, method: str, status: int, seconds: float) -> None:
        assert seconds >= 0
        self.seen.append((route, method, status))


def services(backend: FakeBackend, **kwargs: Any) -> ApiServices:
    return ApiServices(
        registry=CollectorRegistry(),
        readiness=_ready,
        tokens=(SecretStr(TOKEN),),
        prewarm=PrewarmService(backend, FakeClock()),
        max_request_bytes=1024,
        **kwargs,
    )


def warm_backend() -> FakeBackend:
    return FakeBackend(
        Answer("b1", WarmState.WARM, True, detail="warm"), routes=(Route("b1", 1.0), Route("b2", 1.0))
    )


async def send_all(app: ASGIApp, requests: Sequence[tuple[bytes, dict[str, str]]]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://warmer.test") as client:
        return [await client.post("/v1/prewarm", content=body, headers=headers) for body, headers in requests]


ASKS: list[tuple[bytes, dict[str, str]]] = [
    (b'{"agent": "sales", "call_id": "c1"}', {**AUTH, **JSON}),  # 200
    (b'{"agent": "sales", "call_id": "c1"}', {**AUTH, **JSON}),  # 200, the same box again
    (b'{"agent": "sales", "wait_ms": -1}', {**AUTH, **JSON}),  # 422 wait_ms
    (b'{"agent": "sales", "box": "b1"}', {**AUTH, **JSON}),  # 422 box (unknown field)
    (b'{"agent": "sales", "call_id": 7}', {**AUTH, **JSON}),  # 422 call_id
    (b"[" * 100 + b"]" * 100, {**AUTH, **JSON}),  # 400 too deep
    (b'{"agent": NaN}', {**AUTH, **JSON}),  # 400 not JSON
    (b'{"agent": "' + b"x" * 2000 + b'"}', {**AUTH, **JSON}),  # 413
    (b'{"agent": "nobody"}', {**AUTH, **JSON}),  # 404
    (b'{"agent": "sales"}', JSON),  # 401 without a token
    (b'{"agent": "sales"}', {"authorization": "Bearer wrong", **JSON}),  # 401
]


def test_the_front_door_answers_as_the_documented_route_does() -> None:
    """Same status, body and headers that matter, whether the ask goes through the front door or through
    FastAPI's route (the route answers in an app without the front door)."""
    through_front_door = asyncio.run(send_all(create_app(services(warm_backend())), ASKS))
    plain = FastAPI()
    plain.include_router(prewarm_api.router(services(warm_backend())))
    through_route = asyncio.run(send_all(plain, ASKS))
    statuses = [r.status_code for r in through_front_door]
    assert statuses == [200, 200, 422, 422, 422, 400, 400, 413, 404, 401, 401]
    for front, route in zip(through_front_door, through_route, strict=True):
        assert (front.status_code, front.json()) == (route.status_code, route.json())
        for header in ("content-type", "content-length", "www-authenticate", "retry-after"):
            assert front.headers.get(header) == route.headers.get(header), header
    assert [r.json()["field"] for r in through_front_door[2:5]] == ["wait_ms", "box", "call_id"]
    assert through_front_door[0].json()["box_id"] == through_front_door[1].json()["box_id"]


def test_the_ask_does_not_go_through_fastapis_stack_but_every_other_request_does() -> None:
    seen: list[str] = []

    class Recorder:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            seen.append(scope.get("path", ""))
            await self.app(scope, receive, send)

    app = create_app(services(warm_backend()))
    app.add_middleware(Recorder)

    async def scenario() -> tuple[int, int, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer.test") as client:
            ask = await client.post("/v1/prewarm", json={"agent": "sales"}, headers=AUTH)
            wrong_method = await client.get("/v1/prewarm", headers=AUTH)
            health = await client.get("/healthz")
            return ask.status_code, wrong_method.status_code, health.status_code

    assert asyncio.run(scenario()) == (200, 405, 200)
    assert seen == ["/v1/prewarm", "/healthz"]  # the GET went to FastAPI (405), the POST did not


def test_asks_are_counted_under_their_route_template_with_their_status() -> None:
    requests = Requests()
    app = create_app(services(warm_backend(), requests=requests))
    asyncio.run(send_all(app, [ASKS[0], ASKS[2], ASKS[9]]))

    async def health() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer.test") as client:
            await client.get("/healthz")
            await client.get("/no/such/route")

    asyncio.run(health())
    assert requests.seen == [
        ("/v1/prewarm", "POST", 200),
        ("/v1/prewarm", "POST", 422),
        ("/v1/prewarm", "POST", 401),
        ("/healthz", "GET", 200),
        ("unmatched", "GET", 404),
    ]


def test_a_cached_answer_never_outlives_the_routes_or_the_slot_it_was_encoded_for() -> None:
    backend = warm_backend()
    backend.routes = (Route("b1", 1.0),)
    backend.slots = {"b1": 0, "b2": 1}
    app = create_app(services(backend))

    async def ask(call: str) -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer.test") as client:
            response = await client.post(
                "/v1/prewarm", json={"agent": "sales", "call_id": call}, headers=AUTH
            )
            body: dict[str, Any] = response.json()
            return body

    first = asyncio.run(ask("c1"))
    assert (first["box_id"], first["slot"], first["ready"]) == ("b1", 0, True)
    backend.slots = {"b1": 1, "b2": 1}
    assert asyncio.run(ask("c2"))["slot"] == 1
    backend.routes = (Route("b2", 1.0),)
    moved = asyncio.run(ask("c3"))
    assert (moved["box_id"], moved["base_url"]) == ("b2", backend.boxes["b2"].base_url)
    backend.answer = Answer("b2", WarmState.WARMING, False, detail="warming")
    cold = asyncio.run(ask("c4"))
    assert (cold["state"], cold["ready"], cold["detail"], cold["slot"]) == ("warming", False, "warming", None)


# ------------------------------------------------------------------------------------------ server stack


def test_the_server_follows_the_api_settings() -> None:
    app = create_app(services(warm_backend()))
    default = api_server(app, ApiSettings(), graceful_shutdown_seconds=3).config
    assert (default.http, default.backlog, default.access_log) == ("httptools", 2048, False)
    assert default.timeout_graceful_shutdown == 3
    chosen = api_server(
        app, ApiSettings(http_parser="h11", backlog=64, access_log=True), graceful_shutdown_seconds=1
    ).config
    assert (chosen.http, chosen.backlog, chosen.access_log) == ("h11", 64, True)


@pytest.mark.parametrize(("event_loop", "expected"), [("uvloop", True), ("asyncio", False)])
def test_the_daemon_runs_on_the_configured_event_loop(event_loop: str, expected: bool) -> None:
    async def on_uvloop() -> int:
        return int(isinstance(asyncio.get_running_loop(), uvloop.Loop))

    assert run_daemon_loop(on_uvloop(), event_loop) == int(expected)


def test_server_settings_reject_what_they_do_not_know() -> None:
    with pytest.raises(ValueError, match="event_loop"):
        ApiSettings.model_validate({"event_loop": "trio"})
    with pytest.raises(ValueError, match="backlog"):
        ApiSettings(backlog=1)


def test_request_metrics_count_every_request_by_route_method_and_status_class() -> None:
    metrics = Metrics()
    for status in (200, 200, 204, 404):
        metrics.http.request_finished("/v1/prewarm", "POST", status, 0.002)
    metrics.http.request_finished("/healthz", "GET", 200, 0.001)

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    assert value("warmer_http_requests_total", route="/v1/prewarm", method="POST", status="2xx") == 3
    assert value("warmer_http_requests_total", route="/v1/prewarm", method="POST", status="4xx") == 1
    assert value("warmer_http_requests_total", route="/healthz", method="GET", status="2xx") == 1
    assert value("warmer_http_request_seconds_count", route="/v1/prewarm") == 4
    assert value("warmer_http_request_seconds_bucket", route="/v1/prewarm", le="0.001") == 0
    assert value("warmer_http_request_seconds_bucket", route="/healthz", le="0.001") == 1
