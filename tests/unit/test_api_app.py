"""The API factory: /healthz, /readyz (with a reason), /metrics from the app's own registry, bearer auth."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import Depends, FastAPI
from prometheus_client import CollectorRegistry, Counter
from pydantic import SecretStr

from warmer.api import ApiServices, Readiness, create_app
from warmer.api.auth import require_token
from warmer.root.metrics import Metrics

READY = Readiness(True)


def services(readiness: Readiness | Exception = READY, **kwargs: object) -> ApiServices:
    async def check() -> Readiness:
        if isinstance(readiness, Exception):
            raise readiness
        return readiness

    return ApiServices(registry=kwargs.pop("registry", None) or Metrics().registry, readiness=check, **kwargs)  # type: ignore[arg-type]


def get(app: FastAPI, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            return await client.get(path, headers=headers)

    return asyncio.run(call())


def test_healthz_answers_ok() -> None:
    response = get(create_app(services()), "/healthz")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


def test_readyz_follows_the_daemon() -> None:
    assert get(create_app(services(Readiness(True))), "/readyz").json() == {"status": "ready"}
    response = get(
        create_app(services(Readiness(False, "database unreachable: OperationalError"))), "/readyz"
    )
    assert response.status_code == 503
    assert response.json() == {"status": "not ready", "reason": "database unreachable: OperationalError"}


def test_readyz_answers_even_when_the_check_breaks() -> None:
    response = get(create_app(services(RuntimeError("boom"))), "/readyz")
    assert response.status_code == 503
    assert "boom" in response.json()["reason"]


def test_metrics_come_from_this_apps_registry_only() -> None:
    first, second = Metrics(), Metrics()  # two daemons in one process never collide
    first.up.set(1)
    Counter("only_in_first", "test counter", registry=first.registry).inc(3)
    response = get(create_app(services(registry=first.registry)), "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "warmer_up 1.0" in response.text
    assert "only_in_first_total 3.0" in response.text
    assert "process_" in response.text or "python_info" in response.text
    other = get(create_app(services(registry=second.registry)), "/metrics").text
    assert "only_in_first" not in other
    assert "warmer_up 0.0" in other


def test_openapi_lists_the_routes() -> None:
    paths = get(create_app(services()), "/openapi.json").json()["paths"]
    assert {"/healthz", "/readyz", "/metrics"} <= set(paths)


def test_every_app_is_new() -> None:
    registry = CollectorRegistry()
    assert create_app(services(registry=registry)) is not create_app(services(registry=registry))


def protected_app(tokens: tuple[str, ...]) -> FastAPI:
    api_services = services(tokens=tuple(SecretStr(t) for t in tokens))
    app = create_app(api_services)

    @app.get("/protected", dependencies=[Depends(require_token(api_services))])
    async def protected() -> dict[str, str]:
        return {"ok": "yes"}

    return app


def test_bearer_tokens_guard_protected_routes() -> None:
    app = protected_app(("old-token", "new-token"))
    assert get(app, "/protected").status_code == 401
    assert get(app, "/protected", {"authorization": "Bearer wrong"}).status_code == 401
    assert get(app, "/protected", {"authorization": "Basic new-token"}).status_code == 401
    assert get(app, "/protected", {"authorization": "Bearer new-token"}).status_code == 200
    assert get(app, "/protected", {"authorization": "bearer old-token"}).status_code == 200
    assert get(app, "/healthz").status_code == 200  # probes never need a token


def test_no_tokens_means_open_routes() -> None:
    assert get(protected_app(()), "/protected").status_code == 200
