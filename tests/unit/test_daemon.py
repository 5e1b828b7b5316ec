"""The composition root: a built daemon serves its API, reports readiness from its store, stops cleanly."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest

from warmer.config.settings import Settings
from warmer.root.app import Daemon, build
from warmer.root.database import ManagedStore


class FakeStore:
    """Just enough of the store for the root: a ping that can be made to fail, and a close."""

    def __init__(self) -> None:
        self.reachable = True
        self.closed = False

    async def ping(self) -> None:
        if not self.reachable:
            raise ConnectionError("no route to database")

    async def close(self) -> None:
        self.closed = True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(tmp_path: Path, port: int) -> Settings:
    return Settings(
        api={"host": "127.0.0.1", "port": port},
        database={"state_dir": str(tmp_path)},
        reconcile={"shutdown_grace_seconds": 5},
    )


def build_with(settings: Settings, store: FakeStore, prepared: list[str]) -> Daemon:
    def factory(_: Settings) -> ManagedStore:
        return store  # type: ignore[return-value]

    return build(settings, store_factory=factory, prepare=lambda s: prepared.append(s.database_url()))


async def wait_until_started(daemon: Daemon, running: asyncio.Task[int]) -> None:
    for _ in range(600):
        if daemon.started:
            return
        if running.done():
            raise AssertionError(f"daemon ended early with {running.result()}")
        await asyncio.sleep(0.05)
    raise AssertionError("daemon did not start")


def test_daemon_serves_reports_readiness_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    store, prepared = FakeStore(), []
    daemon = build_with(settings_for(tmp_path, port), store, prepared)

    async def scenario() -> int:
        assert (await daemon.readiness()).reason == "starting"
        running = asyncio.create_task(daemon.run(handle_signals=False))
        await wait_until_started(daemon, running)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).json() == {"status": "ok"}
            assert (await client.get("/readyz")).status_code == 200
            metrics = (await client.get("/metrics")).text
            assert "warmer_up 1.0" in metrics
            assert "warmer_ready 1.0" in metrics
            store.reachable = False
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json()["reason"] == "database unreachable: ConnectionError"
        daemon.supervisor.request_stop("test over")
        return await running

    assert asyncio.run(scenario()) == 0
    assert prepared == [f"sqlite:///{tmp_path / 'warmer.db'}"]
    assert store.closed
    assert daemon.http.is_closed


def test_a_failed_database_preparation_is_fatal(tmp_path: Path) -> None:
    def broken(_: Settings) -> None:
        raise RuntimeError("migration failed")

    store = FakeStore()
    daemon = build(
        settings_for(tmp_path, free_port()),
        store_factory=lambda _: store,  # type: ignore[arg-type,return-value]
        prepare=broken,
    )
    assert asyncio.run(daemon.run(handle_signals=False)) == 1
    assert daemon.http.is_closed


def test_a_port_in_use_is_fatal(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        store = FakeStore()
        daemon = build_with(settings_for(tmp_path, port), store, [])
        assert asyncio.run(daemon.run(handle_signals=False)) == 1
    assert store.closed
    sample = daemon.metrics.registry.get_sample_value("warmer_root_task_failures_total", {"task": "api"})
    assert sample == 1.0


def test_store_is_only_there_while_running(tmp_path: Path) -> None:
    daemon = build_with(settings_for(tmp_path, free_port()), FakeStore(), [])
    with pytest.raises(RuntimeError, match="only while the daemon runs"):
        _ = daemon.store


def test_warmer_ready_follows_the_daemon_between_probes_and_drops_when_stopping(tmp_path: Path) -> None:
    port = free_port()
    store = FakeStore()
    daemon = build_with(settings_for(tmp_path, port), store, [])

    def ready_gauge() -> float | None:
        return daemon.metrics.registry.get_sample_value("warmer_ready")

    async def scenario() -> int:
        running = asyncio.create_task(daemon.run(handle_signals=False))
        await wait_until_started(daemon, running)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert "warmer_ready 1.0" in (await client.get("/metrics")).text
            store.reachable = False  # no /readyz probe in between: the scrape itself re-checks
            assert "warmer_ready 0.0" in (await client.get("/metrics")).text
            store.reachable = True
            assert "warmer_ready 1.0" in (await client.get("/metrics")).text
        daemon.supervisor.request_stop("test over")
        stopping = await daemon.readiness()
        assert (stopping.ready, stopping.reason) == (False, "stopping (test over)")
        assert ready_gauge() == 0
        return await running

    assert asyncio.run(scenario()) == 0
    assert ready_gauge() == 0


def test_a_second_daemon_on_the_same_sqlite_file_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first_store, second_store, prepared = FakeStore(), FakeStore(), []
    first = build_with(settings_for(tmp_path, free_port()), first_store, prepared)
    second = build_with(settings_for(tmp_path, free_port()), second_store, prepared)
    third = build_with(settings_for(tmp_path, free_port()), FakeStore(), [])

    async def scenario() -> tuple[int, int]:
        running = asyncio.create_task(first.run(handle_signals=False))
        await wait_until_started(first, running)
        second_run = asyncio.create_task(second.run(handle_signals=False))
        done, _ = await asyncio.wait({second_run}, timeout=30)
        if not done:  # it started: stop both, then fail below
            second.supervisor.request_stop("test over")
            await second_run
        first.supervisor.request_stop("test over")
        return (second_run.result() if done else -1), await running

    assert asyncio.run(scenario()) == (1, 0)
    assert prepared == [f"sqlite:///{tmp_path / 'warmer.db'}"]  # the second never touched the database
    assert not second_store.closed  # never opened
    assert second.http.is_closed
    logged = capsys.readouterr()
    refusal = f"database file {tmp_path / 'warmer.db'} is in use by another warmer serve"
    assert refusal in logged.out + logged.err
    # the first released its lock when it stopped: a new daemon on the file starts
    assert (tmp_path / "warmer.db.lock").read_text().strip().isdigit()

    async def again() -> int:
        running = asyncio.create_task(third.run(handle_signals=False))
        await wait_until_started(third, running)
        third.supervisor.request_stop("test over")
        return await running

    assert asyncio.run(again()) == 0


def test_a_server_database_takes_no_file_lock(tmp_path: Path) -> None:
    from warmer.adapters.store.filelock import sqlite_database_file

    assert sqlite_database_file("postgresql+psycopg://u@h/db") is None
    assert sqlite_database_file("sqlite://") is None
    assert sqlite_database_file("sqlite:///:memory:") is None
    assert sqlite_database_file(f"sqlite:///{tmp_path}/x.db") == tmp_path / "x.db"


def test_a_daemon_without_a_fleet_answers_an_empty_fleet_and_takes_no_work(tmp_path: Path) -> None:
    """Nothing reconciles without boxes or discovery: status says so, and neither a pre-call ask nor a
    deploy event is accepted for work nobody would do."""
    daemon = build_with(settings_for(tmp_path, free_port()), FakeStore(), [])

    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        await daemon.open()
        try:
            transport = httpx.ASGITransport(app=daemon.api)
            async with httpx.AsyncClient(transport=transport, base_url="http://warmer") as client:
                return (
                    await client.get("/v1/boxes"),
                    await client.post("/v1/prewarm", json={"agent": "sales"}),
                    await client.post("/v1/events/deploy", content=b"{}"),
                )
        finally:
            await daemon.close()

    boxes, prewarm, deploy = asyncio.run(scenario())
    assert (boxes.status_code, boxes.json()) == (200, {"boxes": []})
    assert prewarm.status_code == 503
    assert deploy.status_code == 503
    assert daemon.supervisor.task_names == ("api", "loop-lag")


def test_a_serve_process_freezes_the_heap_it_started_with(tmp_path: Path) -> None:
    """`warmer serve` runs the daemon with `freeze_heap`: once built (the app, the reconciler, the
    services), what is alive leaves the garbage collector's full collections (`warmer.root.heap`)."""
    import gc

    port = free_port()
    store = FakeStore()
    daemon = build_with(settings_for(tmp_path, port), store, [])
    gc.unfreeze()

    async def scenario() -> int:
        running = asyncio.create_task(daemon.run(handle_signals=False, freeze_heap=True))
        await wait_until_started(daemon, running)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        assert not any(obj is daemon.api for obj in gc.get_objects())  # built before the freeze
        daemon.supervisor.request_stop("test over")
        return await running

    try:
        assert asyncio.run(scenario()) == 0
    finally:
        gc.unfreeze()
