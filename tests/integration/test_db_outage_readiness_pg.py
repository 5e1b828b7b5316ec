"""A real `warmer serve` on a real PostgreSQL that stops taking connections while one of its real llama-server
boxes restarts: the restarted, cold box leaves `/v1/boxes/{id}/ready` (503) and the routes at once, during
the outage, and is warm and ready again once the database answers (its new epoch written then).

The outage is PostgreSQL's own switch on a throwaway database (`set_connections`, as in
test_store_outage_pg.py), so nothing else on the server notices.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from testbed.fleet import free_loopback_port
from tests.integration.daemon_harness import (
    FleetFactory,
    clean_env,
    fleet_boxes,
    running_serve,
    write_config,
)
from tests.integration.test_store_outage_pg import set_connections
from warmer.adapters.store import SqlStore, upgrade_database

pytestmark = pytest.mark.integration

OUTAGE_HOLD_SECONDS = 5.0  # the restarted box must stay out for the whole outage, not just blink out


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_an_engine_restarted_during_a_postgresql_outage_is_not_ready_until_rewarmed(
    database_url: str, llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    upgrade_database(database_url)
    fleet = llama_fleet_factory(2, slots=2, ctx_per_slot=4096)
    port = free_loopback_port()
    config = write_config(tmp_path, fleet_boxes(fleet), port)
    config.write_text(config.read_text().replace("[database]\n", f'[database]\nurl = "{database_url}"\n', 1))
    box_ids = [box.id for box in fleet.boxes]
    restarted = box_ids[0]

    with running_serve(config, port, tmp_path / "serve.log", env=clean_env()) as serve:
        serve.wait("both boxes ready", lambda: all(serve.is_ready(b) for b in box_ids))
        old_epoch = serve.box(restarted)["epoch"]

        set_connections(database_url, allowed=False)
        try:
            fleet.restart(restarted)
            serve.wait("the restarted box to answer 503", lambda: serve.ready_status(restarted) == 503, 60.0)
            held_until = time.monotonic() + OUTAGE_HOLD_SECONDS
            while time.monotonic() < held_until:
                assert serve.ready_status(restarted) == 503, serve.log_tail()
                routes = httpx.get(f"{serve.base_url}/v1/routes", timeout=10)
                if routes.status_code == 200:  # a 503 (store unavailable) is closed too
                    listed = [
                        r["box_id"] for entry in routes.json()["routes"].values() for r in entry["routes"]
                    ]
                    assert restarted not in listed, routes.text
                time.sleep(0.2)
            assert serve.is_ready(box_ids[1])  # the untouched box keeps serving from the daemon's view
        finally:
            set_connections(database_url, allowed=True)

        serve.wait("the restarted box ready again", lambda: serve.is_ready(restarted))
        new_epoch = serve.box(restarted)["epoch"]
        assert new_epoch != old_epoch
        serve.stop()

    async def stored_epoch() -> str | None:
        store = SqlStore.from_url(database_url)
        try:
            return await store.current_epoch(restarted)
        finally:
            await store.close()

    assert asyncio.run(stored_epoch()) == new_epoch  # written once the database answered
