"""SglangRouterGateway against in-process fakes of both router APIs (httpx.MockTransport).

The fakes behave like the real routers: the current one adds workers in the background (202, then
listed) and deletes by worker UUID; the legacy one adds/removes synchronously by URL query.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from urllib.parse import unquote

import httpx
import pytest

from warmer.adapters.gateway.sglang_router import SglangRouterGateway
from warmer.core.errors import GatewayError
from warmer.core.model import BoxSpec, EngineKind

ROUTER = "http://router.test:30000"
BOX = BoxSpec(id="b1", base_url="http://10.0.0.5:8080/", engine=EngineKind.LLAMACPP, model="tiny")
OTHER = BoxSpec(id="b2", base_url="http://10.0.0.6:8080", engine=EngineKind.LLAMACPP, model="tiny")


class WorkersRouter:
    """Current gateway: POST /workers -> 202 and the worker appears after `delay_polls` listings."""

    def __init__(self, *, delay_polls: int = 1, reachable: bool = True, ids: bool = True) -> None:
        self.workers: dict[str, str] = {}  # id -> url
        self.pending: list[tuple[int, str]] = []
        self.delay_polls = delay_polls
        self.reachable = reachable
        self.ids = ids
        self.calls: list[str] = []
        self.states: dict[str, dict[str, object]] = {}  # url -> fields its entry shows (e.g. is_healthy)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        if request.url.path == "/workers" and request.method == "GET":
            self.pending = [(n - 1, url) for n, url in self.pending]
            for n, url in self.pending:
                if n <= 0 and self.reachable:
                    self.workers[str(uuid.uuid4())] = url
            self.pending = [(n, url) for n, url in self.pending if n > 0]
            entries = [
                {"id": i, "url": u, "is_healthy": True, **self.states.get(u, {})} if self.ids else {"url": u}
                for i, u in self.workers.items()
            ]
            return httpx.Response(200, json={"workers": entries, "total": len(entries)})
        if request.url.path == "/workers" and request.method == "POST":
            url = json.loads(request.content)["url"]
            self.states.pop(url, None)  # a new registration starts afresh
            self.pending.append((self.delay_polls, url))
            return httpx.Response(202, json={"status": "accepted", "url": url})
        if request.url.path.startswith("/workers/") and request.method == "DELETE":
            key = unquote(request.url.raw_path.decode().removeprefix("/workers/"))
            if self.ids:
                if key not in self.workers:
                    return httpx.Response(400, json={"error": f"Invalid worker_id '{key}' (expected UUID)"})
                del self.workers[key]
            else:
                self.workers = {i: u for i, u in self.workers.items() if u != key}
            return httpx.Response(202, json={"status": "accepted"})
        return httpx.Response(404)


class LegacyRouter:
    """Older sglang-router: /add_worker, /remove_worker, /list_workers; no /workers."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.calls: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        url = request.url.params.get("url")
        if request.url.path == "/list_workers":
            return httpx.Response(200, json={"urls": self.urls})
        if request.url.path == "/add_worker" and request.method == "POST" and url:
            self.urls.append(url)
            return httpx.Response(200, text=f"Successfully added worker: {url}")
        if request.url.path == "/remove_worker" and request.method == "POST" and url:
            if url not in self.urls:
                return httpx.Response(400, text=f"Worker {url} not found")
            self.urls.remove(url)
            return httpx.Response(200, text=f"Successfully removed worker: {url}")
        return httpx.Response(404)


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


def gateway(
    router: WorkersRouter | LegacyRouter, **kwargs: object
) -> tuple[SglangRouterGateway, httpx.AsyncClient]:
    client = httpx.AsyncClient(transport=httpx.MockTransport(router.handle))
    clock = iter(range(1_000_000))
    gw = SglangRouterGateway(
        client,
        ROUTER,
        sleep=_no_sleep,
        monotonic=lambda: float(next(clock)),
        settle_timeout=20,
        **kwargs,  # type: ignore[arg-type]
    )
    return gw, client


def test_workers_api_register_waits_until_listed_then_deregisters_by_id() -> None:
    async def scenario() -> None:
        router = WorkersRouter(delay_polls=3)
        gw, client = gateway(router)
        async with client:
            await gw.register(BOX)
            assert gw.api_style == "workers"
            assert await gw.registered() == {"http://10.0.0.5:8080"}
            assert router.calls.count("POST /workers") == 1
            await gw.register(BOX)  # already a worker: no second POST (the router would fail it)
            assert router.calls.count("POST /workers") == 1
            await gw.register(OTHER)
            await gw.deregister(BOX)
            assert await gw.registered() == {"http://10.0.0.6:8080"}
            assert any(call.startswith("DELETE /workers/") for call in router.calls)
            await gw.deregister(BOX)  # not a worker: no-op
            assert sum(call.startswith("DELETE") for call in router.calls) == 1

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "shown",
    [
        {"is_healthy": False},  # sglang-router 0.3.2: health checks failing (measured against the wheel)
        {"status": "Failed"},  # smg: terminal unless --remove-unhealthy-workers
        {"job_status": {"job_type": "AddWorker", "worker_url": "x", "status": "failed", "timestamp": 1}},
    ],
)
def test_an_unusable_registration_is_replaced_not_taken_for_done(shown: dict[str, object]) -> None:
    async def scenario() -> None:
        router = WorkersRouter()
        gw, client = gateway(router)
        async with client:
            await gw.register(BOX)
            router.states["http://10.0.0.5:8080"] = shown
            assert await gw.listing() == {"http://10.0.0.5:8080": False}
            assert await gw.registered() == {"http://10.0.0.5:8080"}  # listed, yet not routed
            await gw.register(BOX)
            assert await gw.listing() == {"http://10.0.0.5:8080": True}
            assert router.calls.count("POST /workers") == 2
            assert sum(call.startswith("DELETE /workers/") for call in router.calls) == 1
            assert len(router.workers) == 1

    asyncio.run(scenario())


def test_workers_api_without_ids_deletes_by_encoded_url() -> None:
    async def scenario() -> None:
        router = WorkersRouter(ids=False)
        gw, client = gateway(router, api_style="workers")
        async with client:
            await gw.register(BOX)
            await gw.deregister(BOX)
            assert await gw.registered() == set()

    asyncio.run(scenario())


def test_unreachable_worker_never_listed_is_an_error() -> None:
    async def scenario() -> None:
        router = WorkersRouter(reachable=False)
        gw, client = gateway(router)
        async with client:
            with pytest.raises(GatewayError, match="did not appear") as caught:
                await gw.register(BOX)
            assert caught.value.transient

    asyncio.run(scenario())


def test_auto_falls_back_to_the_legacy_api() -> None:
    async def scenario() -> None:
        router = LegacyRouter()
        gw, client = gateway(router)
        async with client:
            await gw.register(BOX)
            assert gw.api_style == "legacy"
            assert router.urls == ["http://10.0.0.5:8080"]
            assert await gw.registered() == {"http://10.0.0.5:8080"}
            await gw.register(BOX)
            assert router.calls.count("POST /add_worker") == 1
            await gw.deregister(BOX)
            assert router.urls == []
            await gw.deregister(BOX)
            assert router.calls.count("POST /remove_worker") == 1

    asyncio.run(scenario())


def test_explicit_legacy_style_never_asks_for_workers() -> None:
    async def scenario() -> None:
        router = LegacyRouter()
        gw, client = gateway(router, api_style="legacy")
        async with client:
            await gw.register(OTHER)
            assert "GET /workers" not in router.calls

    asyncio.run(scenario())


def test_router_errors_are_typed() -> None:
    async def scenario() -> None:
        def broken(request: httpx.Request) -> httpx.Response:
            return httpx.Response(503, text="overloaded")

        async with httpx.AsyncClient(transport=httpx.MockTransport(broken)) as client:
            gw = SglangRouterGateway(client, ROUTER, sleep=_no_sleep)
            with pytest.raises(GatewayError, match="HTTP 503") as caught:
                await gw.registered()
            assert caught.value.transient

        def refuses(request: httpx.Request) -> httpx.Response:
            if request.method == "GET":
                return httpx.Response(200, json={"workers": []})
            return httpx.Response(401, text="unauthorized")

        async with httpx.AsyncClient(transport=httpx.MockTransport(refuses)) as client:
            gw = SglangRouterGateway(client, ROUTER, sleep=_no_sleep, api_key="k")
            with pytest.raises(GatewayError, match="HTTP 401") as caught:
                await gw.register(BOX)
            assert not caught.value.transient

    asyncio.run(scenario())


def test_transport_failure_is_transient() -> None:
    async def scenario() -> None:
        def down(request: httpx.Request) -> httpx.Response:
            raise httpx.ConnectError("connection refused", request=request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as client:
            gw = SglangRouterGateway(client, ROUTER, sleep=_no_sleep)
            with pytest.raises(GatewayError, match="ConnectError") as caught:
                await gw.register(BOX)
            assert caught.value.transient

    asyncio.run(scenario())


def test_api_key_is_sent_as_bearer() -> None:
    async def scenario() -> None:
        seen: list[str | None] = []

        def handle(request: httpx.Request) -> httpx.Response:
            seen.append(request.headers.get("authorization"))
            return httpx.Response(200, json={"workers": []})

        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            await SglangRouterGateway(client, ROUTER, api_key="admin-key").registered()
        assert seen == ["Bearer admin-key"]

    asyncio.run(scenario())


def test_unexpected_listing_body_is_an_error() -> None:
    async def scenario() -> None:
        def handle(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"workers": "nope"})

        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            with pytest.raises(GatewayError, match="not a list"):
                await SglangRouterGateway(client, ROUTER).registered()

    asyncio.run(scenario())


class GatewayWithConflict(WorkersRouter):
    """smg (lightseekorg/smg @ 73da68c, model_gateway/src/worker/service.rs): a POST for a URL it already
    has answers 409 {"error": "Worker already exists at URL ... with ID ...",
    "code": "WORKER_ALREADY_EXISTS"}."""

    def __init__(self, *, lagging_listings: int = 0) -> None:
        super().__init__(delay_polls=0)
        self.bodies: list[dict[str, object]] = []
        self.lagging_listings = lagging_listings  # listings that do not show workers yet

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/workers" and request.method == "GET" and self.lagging_listings > 0:
            self.lagging_listings -= 1
            self.calls.append("GET /workers")
            return httpx.Response(200, json={"workers": [], "total": 0})
        if request.url.path == "/workers" and request.method == "POST":
            body = json.loads(request.content)
            self.bodies.append(body)
            if body["url"] in self.workers.values() or any(u == body["url"] for _, u in self.pending):
                self.calls.append("POST /workers")
                return httpx.Response(
                    409,
                    json={
                        "error": f"Worker already exists at URL '{body['url']}' with ID 1.",
                        "code": "WORKER_ALREADY_EXISTS",
                    },
                )
        return super().handle(request)


def test_409_already_exists_is_success() -> None:
    """The worker is there but the first listing lagged: the POST gets 409, which is success once listed."""

    async def scenario() -> None:
        router = GatewayWithConflict(lagging_listings=1)
        router.workers["w-1"] = "http://10.0.0.5:8080"
        gw, client = gateway(router)
        async with client:
            await gw.register(BOX)
            assert router.calls.count("POST /workers") == 1
            assert await gw.registered() == {"http://10.0.0.5:8080"}

    asyncio.run(scenario())


def test_runtime_type_for_sglang_and_vllm_boxes_none_for_llamacpp() -> None:
    async def scenario() -> None:
        router = GatewayWithConflict()
        gw, client = gateway(router)
        sglang = BoxSpec(id="s", base_url="http://10.0.0.7:30000", engine=EngineKind.SGLANG, model="m")
        vllm = BoxSpec(id="v", base_url="http://10.0.0.8:8000", engine=EngineKind.VLLM, model="m")
        async with client:
            for box in (sglang, vllm, BOX):
                await gw.register(box)
        assert router.bodies == [
            {"url": "http://10.0.0.7:30000", "runtime_type": "sglang"},
            {"url": "http://10.0.0.8:8000", "runtime_type": "vllm"},
            {"url": "http://10.0.0.5:8080"},
        ]

    asyncio.run(scenario())
