"""The OpenAPI schema declares the bearer scheme the API enforces: every operation that answers 401 for a
missing token lists it, and the probe and metrics routes, which never need a token, do not."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from warmer.api import ApiServices, Readiness, create_app


def _schema() -> dict[str, Any]:
    async def ready() -> Readiness:
        return Readiness(True)

    services = ApiServices(registry=CollectorRegistry(), readiness=ready, tokens=(SecretStr("t0ken"),))

    async def get() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            schema: dict[str, Any] = (await client.get("/openapi.json")).json()
            return schema

    return asyncio.run(get())


def test_the_bearer_scheme_is_declared_and_used_by_every_operation_that_answers_401() -> None:
    schema = _schema()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from api.tokens: `Authorization: Bearer <token>`.",
    }
    secured, open_ = [], []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path == "/v1/events/deploy":  # signed, not bearer: it documents its signature header
                assert [p["name"] for p in operation["parameters"]] == ["X-Warmer-Signature"]
                assert "security" not in operation
                continue
            (secured if "401" in operation["responses"] else open_).append((method, path, operation))
    assert {(method, path) for method, path, _ in secured} >= {
        ("get", "/v1/boxes"),
        ("post", "/v1/prewarm"),
        ("get", "/v1/capacity"),
    }
    for method, path, operation in secured:
        assert operation.get("security") == [{"bearer": []}], f"{method} {path}"
    assert {(method, path) for method, path, _ in open_} >= {
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/v1/boxes/{box_id}/ready"),
    }
    for method, path, operation in open_:
        assert "security" not in operation, f"{method} {path} needs no token"
