"""PostgreSQL down for 30 s under a running `warmer serve`, one of its two real llama-server boxes restarted
5 s into the outage. The server is a private one started by the test (tests/integration/private_postgres.py),
stopped and started again for real, so the shared cluster never blinks for anyone else.

During the outage: the daemon stays alive, its API answers with statuses, never a 500 (a store read is a
503 with a reason), the restarted (cold) box is never ready, the untouched box keeps being ready from what
the daemon sees. Afterwards: the restarted box is warmed and ready again, a real first turn to each ready
engine reuses the whole prefix, and every event row written before the outage is still there.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.integration.daemon_harness import FleetFactory
from tests.integration.fault_harness import assert_no_row_lost, event_rows, fault_rig
from tests.integration.private_postgres import private_postgres
from warmer.adapters.store import upgrade_database

pytestmark = pytest.mark.integration

OUTAGE_SECONDS = 30.0
RESTART_AFTER_SECONDS = 5.0
API_PATHS = ("/v1/boxes", "/v1/routes", "/v1/campaigns", "/readyz", "/healthz")


def test_a_30s_postgresql_outage_fails_closed_and_loses_nothing(
    llama_fleet_factory: FleetFactory, tmp_path: Path
) -> None:
    with private_postgres() as postgres:
        upgrade_database(postgres.url)
        with fault_rig(llama_fleet_factory, tmp_path, boxes=2, database_url=postgres.url) as rig:
            restarted, untouched = rig.box_ids
            before = event_rows(postgres.url)
            old_epoch = rig.serve.box(restarted)["epoch"]
            statuses: set[int] = set()

            postgres.stop()
            outage_started = time.monotonic()
            restart_done = False
            while time.monotonic() - outage_started < OUTAGE_SECONDS:
                if not restart_done and time.monotonic() - outage_started >= RESTART_AFTER_SECONDS:
                    rig.fleet.restart(restarted)
                    rig.serve.wait(
                        "the restarted box out of readiness",
                        lambda: rig.serve.ready_status(restarted) == 503,
                        60,
                    )
                    restart_done = True
                assert rig.serve.process.poll() is None, rig.serve.log_tail()
                for path in API_PATHS:
                    statuses.add(httpx.get(f"{rig.serve.base_url}{path}", timeout=10).status_code)
                if restart_done:
                    assert rig.serve.ready_status(restarted) == 503, rig.serve.log_tail()
                assert rig.serve.is_ready(untouched), rig.serve.log_tail()
                time.sleep(0.5)
            assert restart_done
            assert 500 not in statuses, statuses
            assert 503 in statuses  # the database being down is said, not hidden

            postgres.start()
            rig.serve.wait("the restarted box ready again", lambda: rig.serve.is_ready(restarted))
            assert rig.serve.box(restarted)["epoch"] != old_epoch
            rig.wait_all_ready()
            rig.end_checks(before)
            assert_no_row_lost(before, event_rows(postgres.url))
