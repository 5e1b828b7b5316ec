"""A database that stops answering, at our own seam (`OutageStore` raises StoreUnavailable as the SqlStore
does): every API route that reads or writes the store answers 503 with the reason and Retry-After, never a
500 with a traceback, and serves again once the database is back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from tests.unit.frontdoor_stack import OUTAGE, Stack, build_stack

T = TypeVar("T")
CAMPAIGN = {"agent": "sales", "starts_at": 1_700_000_000, "ends_at": 1_700_003_600, "expected_calls": 10}


def run(stack: Stack, scenario: Callable[[httpx.AsyncClient], Awaitable[T]]) -> T:
    async def go() -> T:
        async with stack.client() as client:
            return await scenario(client)

    return asyncio.run(go())


@pytest.fixture
def stack(tmp_path: Path) -> Stack:
    return build_stack(tmp_path)


def test_a_database_outage_is_503_with_a_reason_on_every_route_that_reads_the_store(stack: Stack) -> None:
    stack.store.down = True

    async def scenario(client: httpx.AsyncClient) -> dict[str, httpx.Response]:
        body, headers = stack.signed_event(
            {"id": "r-1", "kind": "rollout.started", "occurred_at": "2025-01-31T12:00:00Z", "box_ids": ["b1"]}
        )
        return {
            "boxes": await client.get("/v1/boxes"),
            "box": await client.get("/v1/boxes/b1"),
            "list": await client.get("/v1/campaigns"),
            "put": await client.put("/v1/campaigns/c", json=CAMPAIGN),
            "delete": await client.delete("/v1/campaigns/c"),
            "webhook": await client.post("/v1/events/deploy", content=body, headers=headers),
        }

    answers = run(stack, scenario)
    for name in ("boxes", "box", "list", "put", "delete"):
        response = answers[name]
        assert response.status_code == 503, (name, response.text)
        assert response.json() == {"error": "unavailable", "reason": OUTAGE}, name
        assert response.headers["retry-after"] == "2"
    webhook = answers["webhook"]
    assert webhook.status_code == 503, webhook.text
    assert webhook.json()["outcome"] == "unavailable"
    assert webhook.json()["detail"] == f"{OUTAGE}; retry later"

    stack.store.down = False  # the database is back: the same webhook is applied, not a "duplicate"

    async def after(client: httpx.AsyncClient) -> list[httpx.Response]:
        body, headers = stack.signed_event(
            {"id": "r-1", "kind": "rollout.started", "occurred_at": "2025-01-31T12:00:00Z", "box_ids": ["b1"]}
        )
        return [
            await client.get("/v1/boxes"),
            await client.post("/v1/events/deploy", content=body, headers=headers),
        ]

    boxes, webhook_again = run(stack, after)
    assert boxes.status_code == 200
    assert webhook_again.status_code == 202, webhook_again.text
