"""Every front door of the API over real services: the real Reconciler over a FakeEngine and a FakeClock,
a real SqlStore on a temp SQLite file, and the real prewarm, campaign, status, capacity and deploy
services, with a bearer token and a webhook signing secret configured.

`OutageStore` is the database outage at our own seam: the SqlStore, except that while `down` is set every
call raises `StoreUnavailable`, as the SqlStore itself does when its database stops answering.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from tests.unit.reconciler_fakes import PROFILE, FakeClock, SpecTextPrefixSource, World, agent, settle, world
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.api import ApiServices, Readiness, create_app
from warmer.config.server_settings import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_WEBHOOK_MAX_BODY_BYTES
from warmer.core.errors import StoreUnavailable
from warmer.core.webhook import SIGNATURE_HEADER, BoxUrlPolicy, sign_body
from warmer.service.campaigns import CampaignService
from warmer.service.capacity import CapacityService, PrefillCeilings
from warmer.service.deploy import DeployService, WebhookConfig
from warmer.service.prewarm import PrewarmService, ReconcilerBackend
from warmer.service.status import StatusService
from warmer.service.usage import UsageService

TOKEN = "front-door-token"
SECRET = "front-door-secret"
ALLOWED_BOX_URLS = ("http://*.gpu.internal:18093", "http://10.0.9.*:8080")
OUTAGE = "database unavailable: connection refused (the database is down)"
# SQLAlchemy's layout: the statement and its parameters follow the first line (never shown to a client)
OUTAGE_DETAIL = "\n[SQL: SELECT * FROM webhook_events WHERE id = ?]\n[parameters: ('secret-id',)]"


class OutageStore:
    """The SqlStore, or a database that does not answer while `down` is True."""

    def __init__(self, store: SqlStore) -> None:
        self._store = store
        self.down = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._store, name)
        if not asyncio.iscoroutinefunction(attribute):
            return attribute

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable(OUTAGE + OUTAGE_DETAIL)
            return await attribute(*args, **kwargs)

        return call


@dataclass
class Stack:
    world: World
    store: OutageStore
    app: FastAPI

    @property
    def clock(self) -> FakeClock:
        return self.world.clock

    def client(self, token: str | None = TOKEN) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://warmer.test", headers=headers
        )

    def signature(self, body: bytes, secret: str = SECRET) -> dict[str, str]:
        return {
            SIGNATURE_HEADER: sign_body(body, secret, int(self.clock.now())),
            "content-type": "application/json",
        }

    def signed_event(self, event: Mapping[str, Any]) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(event).encode()
        return body, self.signature(body)


async def _ready() -> Readiness:
    return Readiness(True)


async def _stable_share(agent_id: str) -> float | None:
    return 0.9  # the stack's agent: depth as warmer would compute it (a constant is enough for the API)


def build_stack(
    tmp_path: Path,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    webhook_max_body_bytes: int = DEFAULT_WEBHOOK_MAX_BODY_BYTES,
    settle_first: bool = True,
    database_url: str | None = None,
) -> Stack:
    """The stack on a fresh database (a temp SQLite file unless `database_url` names an empty one); with
    `settle_first` the fleet is warm and routed before it returns."""
    url = database_url or f"sqlite:///{tmp_path / 'frontdoor.db'}"
    upgrade_database(url)
    built = world(url, specs={"sales": agent("sales", "You sell things.")}, source=SpecTextPrefixSource())
    store = OutageStore(built.store)
    reconciler = built.reconciler
    agents: Callable[[], list[str]] = lambda: list(reconciler.agent_specs())  # noqa: E731
    services = ApiServices(
        registry=CollectorRegistry(),
        readiness=_ready,
        tokens=(SecretStr(TOKEN),),
        status=StatusService(reconciler, store),  # type: ignore[arg-type]
        prewarm=PrewarmService(ReconcilerBackend(reconciler), built.clock, max_wait_seconds=0.0),
        campaigns=CampaignService(store, agents, on_change=reconciler.poke),  # type: ignore[arg-type]
        deploy=DeployService(
            store=store,  # type: ignore[arg-type]
            clock=built.clock,
            config=WebhookConfig(secrets=(SECRET,), box_url_policy=BoxUrlPolicy(ALLOWED_BOX_URLS)),
            fleet=reconciler,
        ),
        capacity=CapacityService(
            snapshot=reconciler.snapshot,
            usage=None,  # no hit-rate monitor here: use figures are unknown, ceilings from the store
            ceilings=PrefillCeilings(),
            profiles={"m": PROFILE},
            store=store,  # type: ignore[arg-type]
            clock=built.clock,
        ),
        max_request_bytes=max_request_bytes,
        webhook_max_body_bytes=webhook_max_body_bytes,
        usage=UsageService(
            clock=built.clock,
            agents=agents,
            boxes=lambda: list(reconciler.fleet()),
            stable_share=_stable_share,
        ),
    )
    stack = Stack(built, store, create_app(services))
    if settle_first:
        asyncio.run(settle(reconciler))
    return stack
