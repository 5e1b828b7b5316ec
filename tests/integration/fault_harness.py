"""What every fault test checks at its end, and the daemon set-up they share: a real `warmer serve` over real
llama-server boxes, each behind an `EngineProxy` that misbehaves on command.

The end checks (issue 11's fault suite): the daemon is alive (`/healthz` answers), no box is reported ready
that is not (a box `/ready` calls ready serves a real first turn from its cache: the engine's own
`timings.cache_n`, asked directly, not through the proxy), and no row is lost (every event row written
before the fault is still there, unchanged; the log only grows).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from testbed.fleet import LlamaFleet, free_loopback_port
from tests.integration.daemon_harness import (
    AGENT,
    AGENTS_DIR,
    FleetFactory,
    Serve,
    running_serve,
    stable_prefix,
    turn1,
    write_config,
)
from tests.integration.engine_proxy import EngineProxy
from warmer.config.agents import load_agent_specs
from warmer.core.agents import AgentSpec
from warmer.core.prefix import StablePrefix

# Short engine timeouts, so a hung engine fails a warm in seconds, and a quick warm retry.
FAULT_SECTIONS = """
[engines]
connect_timeout_seconds = 1.0
health_timeout_seconds = 2.0
request_timeout_seconds = 4.0
long_request_timeout_seconds = 30.0
"""

Row = dict[str, Any]


def event_rows(database_url: str) -> list[Row]:
    """Every row of the event log, oldest first (SQLite file or PostgreSQL, read with a fresh engine)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            result = connection.execute(
                text("SELECT id, at, kind, box_id, epoch, prefix_hash, detail FROM events ORDER BY id")
            )
            rows = [dict(row._mapping) for row in result]
    finally:
        engine.dispose()
    for row in rows:
        if isinstance(row["detail"], str):  # SQLite hands JSON back as text
            row["detail"] = json.loads(row["detail"])
    return rows


def assert_no_row_lost(before: list[Row], after: list[Row]) -> None:
    """The event log is append-only across the fault: what was there is there, unchanged, in order."""
    assert after[: len(before)] == before, "an event row written before the fault changed or vanished"
    assert len(after) >= len(before)


@dataclass
class FaultRig:
    """The daemon, its boxes (engine processes) and the proxies in front of them."""

    serve: Serve
    fleet: LlamaFleet
    proxies: dict[str, EngineProxy]
    database_url: str
    agent: AgentSpec
    stable: StablePrefix
    box_ids: list[str] = field(default_factory=list)
    config: Path | None = None
    port: int = 0

    def alive(self) -> bool:
        if self.serve.process.poll() is not None:
            return False
        return httpx.get(f"{self.serve.base_url}/healthz", timeout=10).status_code == 200

    def engine_cached_tokens(self, box_id: str) -> int:
        """A real first turn sent to the engine itself: how many prompt tokens it reused from its cache."""
        return int(turn1(self.fleet.box(box_id).base_url, self.agent)["timings"]["cache_n"])

    def assert_ready_boxes_are_warm(self) -> list[str]:
        """Every box `/ready` calls ready serves a first turn from its cache (the engine's own figure)."""
        ready = [b for b in self.box_ids if self.serve.is_ready(b)]
        for box_id in ready:
            cached = self.engine_cached_tokens(box_id)
            assert cached >= self.stable.token_count - 1, (
                f"{box_id} reported ready, but its engine reused {cached} of {self.stable.token_count} "
                f"prefix tokens\n{self.serve.log_tail()}"
            )
        return ready

    def wait_all_ready(self, timeout: float = 240.0) -> None:
        self.serve.wait("every box ready", lambda: all(self.serve.is_ready(b) for b in self.box_ids), timeout)

    def hold_not_ready(
        self,
        box_id: str,
        until: Callable[[], bool],
        what: str,
        *,
        min_seconds: float = 2.0,
        timeout: float = 180.0,
    ) -> None:
        """Until `until()` holds (bounded) and for at least `min_seconds`: the daemon stays alive and never
        calls `box_id` ready (it cannot be warm)."""
        started = time.monotonic()
        while True:
            assert self.alive(), self.serve.log_tail()
            assert not self.serve.is_ready(box_id), (
                f"{box_id} reported ready while cold\n{self.serve.log_tail()}"
            )
            elapsed = time.monotonic() - started
            if elapsed >= min_seconds and until():
                return
            assert elapsed < timeout, f"timed out waiting for {what}\n{self.serve.log_tail()}"
            time.sleep(0.2)

    def end_checks(self, before: list[Row]) -> None:
        """Alive, no false ready, no row lost."""
        assert self.alive(), self.serve.log_tail()
        self.assert_ready_boxes_are_warm()
        assert_no_row_lost(before, event_rows(self.database_url))


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'warmer.db'}"


def proxied_config(
    tmp_path: Path,
    fleet: LlamaFleet,
    proxies: dict[str, EngineProxy],
    port: int,
    *,
    database_url: str | None = None,
    sections: str = FAULT_SECTIONS,
) -> Path:
    config = write_config(
        tmp_path, [(b, proxies[b].base_url) for b in sorted(proxies)], port, sections=sections
    )
    if database_url is not None:
        config.write_text(
            config.read_text().replace("[database]\n", f'[database]\nurl = "{database_url}"\n', 1)
        )
    return config


@contextmanager
def fault_rig(
    llama_fleet_factory: FleetFactory,
    tmp_path: Path,
    *,
    boxes: int = 1,
    database_url: str | None = None,
    log_name: str = "serve.log",
) -> Iterator[FaultRig]:
    """`boxes` llama-server boxes behind proxies and one `warmer serve` over them, every box ready."""
    fleet = llama_fleet_factory(boxes, slots=2, ctx_per_slot=4096)
    agent = load_agent_specs(AGENTS_DIR)[AGENT]
    with ExitStack() as stack:
        proxies = {box.id: stack.enter_context(EngineProxy(box.base_url)) for box in fleet.boxes}
        port = free_loopback_port()
        url = database_url or sqlite_url(tmp_path)
        config = proxied_config(tmp_path, fleet, proxies, port, database_url=database_url)
        serve = stack.enter_context(running_serve(config, port, tmp_path / log_name))
        rig = FaultRig(serve, fleet, proxies, url, agent, stable_prefix(agent), sorted(proxies), config, port)
        rig.wait_all_ready()
        yield rig
