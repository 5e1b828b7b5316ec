"""GET /healthz fails when the reconcile loop has not finished a pass within reconcile.stall_seconds, so a
liveness probe restarts a daemon whose loop is wedged, while a pass that ends on a database error still
counts as progress (the database is /readyz's business)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from tests.unit.reconciler_fakes import FakeClock, world
from warmer.api import ApiServices, Liveness, Readiness, create_app
from warmer.config.loop_settings import ReconcileSettings
from warmer.core.errors import StoreUnavailable


def test_the_loop_is_stalled_only_past_the_bound_since_its_last_pass(store_url: str) -> None:
    async def scenario() -> list[str | None]:
        clock = FakeClock()
        w = world(store_url, clock=clock)
        seen = [w.reconciler.stalled(120)]  # born now: not stalled before its first pass
        clock.t += 121
        seen.append(w.reconciler.stalled(120))  # no pass for 121 s
        await w.reconciler.tick()
        seen.append(w.reconciler.stalled(120))
        clock.t += 100
        seen.append(w.reconciler.stalled(120))
        await w.reconciler.close()
        await w.store.close()
        return seen

    fresh, wedged, after_pass, within = asyncio.run(scenario())
    assert fresh is None
    assert wedged == "no reconcile pass finished for 121s (reconcile.stall_seconds = 120)"
    assert after_pass is None
    assert within is None


def test_a_pass_that_ends_on_a_database_error_still_shows_the_loop_alive(store_url: str) -> None:
    async def scenario() -> str | None:
        clock = FakeClock()
        w = world(store_url, clock=clock)
        clock.t += 500

        async def down() -> None:
            raise StoreUnavailable("database is locked")

        w.reconciler._health.flush = down  # type: ignore[method-assign]  # the pass's first store write
        with pytest.raises(StoreUnavailable):
            await w.reconciler.tick()
        answer = w.reconciler.stalled(120)
        await w.reconciler.close()
        await w.store.close()
        return answer

    assert asyncio.run(scenario()) is None


def _healthz(liveness: Liveness) -> httpx.Response:
    async def ready() -> Readiness:
        return Readiness(True)

    services = ApiServices(registry=CollectorRegistry(), readiness=ready, liveness=lambda: liveness)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(services))
        async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
            return await client.get("/healthz")

    return asyncio.run(get())


def test_healthz_answers_503_with_the_reason_while_the_loop_is_stalled() -> None:
    stalled = _healthz(Liveness(False, "no reconcile pass finished for 300s (reconcile.stall_seconds = 120)"))
    assert stalled.status_code == 503
    assert stalled.json() == {
        "status": "stalled",
        "reason": "no reconcile pass finished for 300s (reconcile.stall_seconds = 120)",
    }
    alive = _healthz(Liveness(True))
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})


def test_the_bound_must_leave_room_for_two_passes() -> None:
    with pytest.raises(ValidationError, match="at least twice"):
        ReconcileSettings(interval_seconds=60, stall_seconds=90)
    assert ReconcileSettings().stall_seconds == 120
