"""A real PostgreSQL that stops taking connections under the API: the store's own errors (psycopg's
OperationalError, translated by SqlStore into StoreUnavailable) give 503 with a reason on every route that
reads or writes the store, never a 500; once the database takes connections again the same routes answer.

The outage is made on a throwaway database only (`ALTER DATABASE ... ALLOW_CONNECTIONS false` and
`pg_terminate_backend` of its sessions: PostgreSQL's own switch), so nothing else on the server notices.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.unit.frontdoor_stack import build_stack

pytestmark = pytest.mark.integration

CAMPAIGN = {"agent": "sales", "starts_at": 1_700_000_000, "ends_at": 1_700_003_600, "expected_calls": 10}


def set_connections(database_url: str, allowed: bool) -> None:
    """Let the database take connections, or refuse new ones and end the open ones."""
    url = make_url(database_url)
    name = url.database
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
            if not allowed:
                connection.execute(
                    text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                    {"name": name},
                )
    finally:
        admin.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_postgresql_outage_is_503_with_a_reason_and_the_api_recovers(
    database_url: str, tmp_path: Path
) -> None:
    stack = build_stack(tmp_path, database_url=database_url)

    async def calls() -> dict[str, httpx.Response]:
        body, headers = stack.signed_event(
            {"id": "r-1", "kind": "rollout.started", "occurred_at": "2025-01-31T12:00:00Z", "box_ids": ["b1"]}
        )
        async with stack.client() as client:
            return {
                "boxes": await client.get("/v1/boxes"),
                "box": await client.get("/v1/boxes/b1"),
                "list": await client.get("/v1/campaigns"),
                "put": await client.put("/v1/campaigns/c", json=CAMPAIGN),
                "webhook": await client.post("/v1/events/deploy", content=body, headers=headers),
            }

    set_connections(database_url, allowed=False)
    try:
        down = asyncio.run(calls())
    finally:
        set_connections(database_url, allowed=True)
    for name in ("boxes", "box", "list", "put"):
        response = down[name]
        assert response.status_code == 503, (name, response.text)
        assert response.json()["error"] == "unavailable"
        assert response.json()["reason"].startswith("database unavailable: "), response.json()
        assert "Traceback" not in response.text
        assert "[SQL:" not in response.text  # the statement never reaches a client
    assert down["webhook"].status_code == 503, down["webhook"].text
    assert down["webhook"].json()["outcome"] == "unavailable"
    assert down["webhook"].json()["detail"].startswith("database unavailable: ")
    assert "[SQL:" not in down["webhook"].text

    up = asyncio.run(calls())
    assert up["boxes"].status_code == 200, up["boxes"].text
    assert up["list"].status_code == 200
    assert up["put"].status_code == 201
    assert up["webhook"].status_code == 202, up["webhook"].text  # the id was not used up by the outage
    asyncio.run(stack.world.store.close())
