"""The composition root: `build(settings) -> Daemon` wires the HTTP client, the store, the metrics and the API
from settings; `Daemon.run()` prepares the database, then supervises the named root tasks until a signal.

Everything I/O is created here and nowhere else, and every piece is injectable (store factory, database
preparation, HTTP transport) so tests swap real parts for fakes at our own seams. Later features add their
root tasks with `daemon.supervisor.add(name, task)` and their API needs as `ApiServices` fields.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import httpx
import uvicorn
from fastapi import FastAPI

import warmer
from warmer.adapters.engines.dispatch import EngineDispatcher
from warmer.adapters.store import SqlStore, current_revision, head_revision, upgrade_database
from warmer.adapters.store.engine import create_store_engine
from warmer.adapters.store.filelock import SqliteFileLock, sqlite_database_file
from warmer.api import ApiServices, Readiness, create_app
from warmer.config.settings import Settings
from warmer.core.agents import AgentSpec
from warmer.core.errors import WarmerError
from warmer.core.model import BoxSpec, ModelProfile
from warmer.ports import StorePort
from warmer.root.capacity import OfflineCallTokens, capacity_config, run_capacity_gauges
from warmer.root.deploy import build_deploy_service
from warmer.root.dialer import DialerWiring
from warmer.root.discovery import run_discovery
from warmer.root.engines import SystemClock, build_engine_dispatcher
from warmer.root.frontdoor import (
    CurrentFleet,
    ReconcilerReadiness,
    ReconcilerSuspects,
    build_gateway,
    hitrate_config,
)
from warmer.root.logging import get_logger
from warmer.root.metrics import Metrics
from warmer.root.reconcile import OfflinePrefixSource, reconciler_config, run_timers
from warmer.root.server import api_server
from warmer.root.supervisor import Supervisor
from warmer.service.capacity import CapacityService, PrefillCeilings
from warmer.service.gateway_sync import GatewaySync
from warmer.service.hitrate_monitor import HitRateMonitor
from warmer.service.reconciler import Reconciler
from warmer.service.restart import RestartWarmup
from warmer.service.status import (
    AgentRoutes,
    BoxView,
    ReadyView,
    StatusQueries,
    StatusService,
    StatusUnavailable,
)

# How long /readyz waits for the database to answer before calling it unreachable (seconds).
READINESS_DB_TIMEOUT_SECONDS = 2.0


class ManagedStore(StorePort, Protocol):
    """The store as the root holds it: the port, plus a health check and a close."""

    async def ping(self) -> None: ...

    async def close(self) -> None: ...


StoreFactory = Callable[[Settings], ManagedStore]
DatabasePreparer = Callable[[Settings], None]
# Takes this daemon's exclusive hold on its database, if it needs one (a SQLite file does); raises when
# another process holds it. Returns what to release at exit.
DatabaseLocker = Callable[[Settings], SqliteFileLock | None]


class DatabaseNotMigrated(WarmerError):
    """A server database whose schema is not at this version's head: `warmer db upgrade` first."""


def open_sql_store(settings: Settings) -> ManagedStore:
    """The SQL store for `settings.database` (embedded SQLite unless a URL is configured)."""
    url = settings.database_url()
    if settings.database.is_embedded:
        return SqlStore.from_url(url)
    engine = create_store_engine(
        url, pool_size=settings.database.pool_size, pool_timeout=settings.database.pool_timeout_seconds
    )
    return SqlStore(engine)


def upgrade_schema(settings: Settings) -> str:
    """Migrate the configured database to head; returns the head revision."""
    if settings.database.is_embedded:
        settings.database.state_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.database_url())
    return head_revision()


def lock_sqlite_file(settings: Settings) -> SqliteFileLock | None:
    """Before anything touches a SQLite database file: hold its lock, or refuse to start (DatabaseInUse
    names the file). A server database is shared by replicas and needs none."""
    database = sqlite_database_file(settings.database_url())
    if database is None:
        return None
    lock = SqliteFileLock(database)
    lock.acquire()
    return lock


def prepare_database(settings: Settings) -> None:
    """Before serving: migrate the embedded SQLite file ourselves (nobody else will); a server database is
    shared by replicas and migrated deliberately, so only check it is at head."""
    if settings.database.is_embedded:
        upgrade_schema(settings)
        return
    current, head = current_revision(settings.database_url()), head_revision()
    if current != head:
        raise DatabaseNotMigrated(
            f"database schema is at {current or 'no revision'}, this warmer needs {head}: "
            "run `warmer db upgrade`"
        )


class Daemon:
    """The running warmer: API server plus (later) the reconciler and scheduler, as supervised root tasks."""

    def __init__(
        self,
        *,
        settings: Settings,
        profiles: Mapping[str, ModelProfile],
        agents: Mapping[str, AgentSpec],
        boxes: Sequence[BoxSpec],
        http: httpx.AsyncClient,
        metrics: Metrics,
        store_factory: StoreFactory,
        prepare: DatabasePreparer,
        lock: DatabaseLocker = lock_sqlite_file,
    ) -> None:
        self.settings = settings
        self.profiles = profiles
        self.agents = agents
        self.boxes = tuple(boxes)
        self.http = http
        self.metrics = metrics
        self._store_factory = store_factory
        self._prepare = prepare
        self._lock_database = lock
        self._database_lock: SqliteFileLock | None = None  # held from start-up to exit
        self._store: ManagedStore | None = None
        self._server: uvicorn.Server | None = None
        self._log = get_logger(__name__)
        self.reconciler: Reconciler | None = None  # built once the store is open (a root task)
        self._reconcile_engines: EngineDispatcher | None = None  # the reconciler's engine client
        self.hitrate_monitor: HitRateMonitor | None = None  # while its root task runs
        # Prefill ceilings measured by the restart warm-ups' long prefills, per box and epoch.
        self.prefill_ceilings = PrefillCeilings()
        self.capacity = CapacityService(
            snapshot=lambda: None if self.reconciler is None else self.reconciler.snapshot(),
            usage=lambda: self.hitrate_monitor,
            ceilings=self.prefill_ceilings,
            profiles=profiles,
            store=lambda: self._store,
            clock=SystemClock(),
            config=capacity_config(settings),
            per_call_tokens=OfflineCallTokens(lambda: self.agents, profiles),
            observer=metrics.capacity,
        )
        self.dialer = DialerWiring(
            settings,
            agents=lambda: self.agents.keys(),
            store=lambda: self._store,
            reconciler=lambda: self.reconciler,
            clock=SystemClock(),
        )
        self.api: FastAPI = create_app(
            ApiServices(
                registry=metrics.registry,
                readiness=self.readiness,
                tokens=tuple(settings.api.tokens),
                status=_DaemonStatus(self),
                prewarm=self.dialer.prewarm,
                campaigns=self.dialer.campaigns,
                deploy=build_deploy_service(
                    settings,
                    store=lambda: self._store,
                    fleet=lambda: self.reconciler,
                    clock=SystemClock(),
                    on_fleet_change=self._fleet_changed,
                ),
                max_request_bytes=settings.api.max_request_bytes,
                webhook_max_body_bytes=settings.api.webhook_max_body_bytes,
                capacity=self.capacity if self.boxes else None,
                requests=metrics.http,
            )
        )
        self.supervisor = Supervisor(
            grace_seconds=settings.reconcile.shutdown_grace_seconds,
            on_task_failure=lambda name: metrics.root_task_failures.labels(task=name).inc(),
        )
        self.supervisor.add("api", self._serve_api)
        if self.boxes or settings.fleet.discovery is not None:  # nothing to reconcile without a fleet
            self.supervisor.add("reconciler", self._run_reconciler)
            self.supervisor.add("scheduler", self._run_scheduler)
            if self.dialer.schedule is not None:
                self.supervisor.add("schedule", self.dialer.run_schedule)
            self.supervisor.add("hitrate", self._run_hitrate_monitor)
            self.supervisor.add("capacity", self._run_capacity_gauges)
            if settings.fleet.gateway is not None:
                self.supervisor.add("gateway-sync", self._run_gateway_sync)
            if settings.fleet.discovery is not None:
                self.supervisor.add("discovery", self._run_discovery)

    def _fleet_changed(self, boxes: Sequence[BoxSpec]) -> None:
        """A deploy event added or removed a box: the reconciler's engine client may call exactly these."""
        if self._reconcile_engines is not None:
            self._reconcile_engines.register(boxes)

    async def _run_reconciler(self, stopping: asyncio.Event) -> None:
        """The reconcile loop over this daemon's store, engines and config."""
        engines = build_engine_dispatcher(self.settings, self.http, boxes=self.boxes, profiles=self.profiles)
        self._reconcile_engines = engines
        self.reconciler = Reconciler(
            engine=engines,
            store=self.store,
            clock=SystemClock(),
            boxes=self.boxes,
            profiles=self.profiles,
            agents=self.agents,
            prefix_source=OfflinePrefixSource(),
            config=reconciler_config(self.settings),
            observer=self.metrics.reconcile,
            demand=self.dialer.prewarm.observed_demand,
            # The reconciler's default warm-up, plus the long prefill's report for the capacity figures.
            restart=RestartWarmup(
                engines, self.store, SystemClock(), on_long_prefill=self.prefill_ceilings.record_long_prefill
            ),
        )
        try:
            await self.reconciler.run(stopping)
        finally:
            self.reconciler = None

    async def _run_discovery(self, stopping: asyncio.Event) -> None:
        """Engine pods from the Kubernetes API join and leave the running fleet."""
        discovery = self.settings.fleet.discovery
        assert discovery is not None  # only added when configured
        await run_discovery(discovery, self.profiles, lambda: self.reconciler, self._fleet_changed, stopping)

    async def _run_gateway_sync(self, stopping: asyncio.Event) -> None:
        """Register ready boxes with `[fleet.gateway]`, withdraw the others (a router outage is retried)."""
        gateway = self.settings.fleet.gateway
        assert gateway is not None  # only added when configured
        sync = GatewaySync(
            gateway=build_gateway(gateway, self.http),
            fleet=CurrentFleet(lambda: self.reconciler, self.boxes),
            readiness=ReconcilerReadiness(lambda: self.reconciler),
            clock=SystemClock(),
            interval_seconds=gateway.sync_seconds,
            observer=self.metrics.gateway,
        )
        await sync.run(stopping)

    async def _run_hitrate_monitor(self, stopping: asyncio.Event) -> None:
        """Per-box hit rate from the engines' counters; a drop marks the box suspect for the reconciler."""
        engines = build_engine_dispatcher(self.settings, self.http, boxes=self.boxes, profiles=self.profiles)
        monitor = HitRateMonitor(
            engine=engines,
            fleet=CurrentFleet(lambda: self.reconciler, self.boxes, also=engines.register),
            clock=SystemClock(),
            config=hitrate_config(self.settings),
            observer=self.metrics.hitrate,
            suspects=ReconcilerSuspects(lambda: self.reconciler),
            ready_boxes=lambda: self.reconciler.ready_box_ids() if self.reconciler is not None else None,
        )
        self.hitrate_monitor = monitor
        try:
            await monitor.run(stopping)
        finally:
            self.hitrate_monitor = None

    async def _run_capacity_gauges(self, stopping: asyncio.Event) -> None:
        """The capacity gauges, refreshed once per hit-rate window (when the use figures change)."""
        await run_capacity_gauges(self.capacity, SystemClock(), self.settings.hitrate.poll_seconds, stopping)

    async def _run_scheduler(self, stopping: asyncio.Event) -> None:
        """Timers: a reconcile tick every `interval_seconds`, a health poll every `health_poll_seconds`."""

        def poke() -> None:
            if self.reconciler is not None:
                self.reconciler.poke()

        await run_timers(self.settings, poke, stopping)

    @property
    def store(self) -> ManagedStore:
        """The open store; only valid while `run()` is running."""
        if self._store is None:
            raise RuntimeError("the store is open only while the daemon runs")
        return self._store

    @property
    def started(self) -> bool:
        """The database is prepared and open, and the API accepts connections."""
        return self._store is not None and self._server is not None and self._server.started

    async def readiness(self) -> Readiness:
        """Ready = started and the database answers a trivial query in time."""
        readiness = await self._check_readiness()
        self.metrics.ready.set(1 if readiness.ready else 0)
        return readiness

    async def _check_readiness(self) -> Readiness:
        if not self.started or self._store is None:
            return Readiness(False, "starting")
        if self.supervisor.stop_reason is not None:  # draining: traffic should leave before the API does
            return Readiness(False, f"stopping ({self.supervisor.stop_reason})")
        try:
            await asyncio.wait_for(self._store.ping(), READINESS_DB_TIMEOUT_SECONDS)
        except TimeoutError:
            return Readiness(False, f"database did not answer within {READINESS_DB_TIMEOUT_SECONDS:g}s")
        except Exception as exc:
            return Readiness(False, f"database unreachable: {type(exc).__name__}")
        return Readiness(True)

    def _release_database(self) -> None:
        lock, self._database_lock = self._database_lock, None
        if lock is not None:
            lock.release()

    async def _serve_api(self, stopping: asyncio.Event) -> None:
        server = api_server(
            self.api,
            self.settings.api,
            graceful_shutdown_seconds=max(1, int(self.settings.reconcile.shutdown_grace_seconds)),
        )
        self._server = server

        async def stop_when_asked() -> None:
            await stopping.wait()
            server.should_exit = True

        watcher = asyncio.create_task(stop_when_asked())
        try:
            await server.serve()
        finally:
            watcher.cancel()

    async def run(self, *, handle_signals: bool = True) -> int:
        """Prepare the database, open the store, serve until stopped. Returns the process exit code."""
        # A stop asked for while the database is being prepared ends the start-up cleanly; the supervisor
        # takes the signals over once the root tasks run.
        loop = asyncio.get_running_loop()
        stop_during_startup = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop_during_startup.set)
        try:
            self._database_lock = self._lock_database(self.settings)
            preparing = asyncio.create_task(asyncio.to_thread(self._prepare, self.settings))
            stop_asked = asyncio.create_task(stop_during_startup.wait())
            await asyncio.wait({preparing, stop_asked}, return_when=asyncio.FIRST_COMPLETED)
            stop_asked.cancel()
            if not preparing.done():
                self._log.info("stopped during start-up")
                self._release_database()
                await self.http.aclose()
                return 0
            preparing.result()
            self._store = self._store_factory(self.settings)
        except Exception as exc:
            self._log.error("startup failed", error=f"{type(exc).__name__}: {exc}")
            self._release_database()
            await self.http.aclose()
            return 1
        finally:
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        self._log.info(
            "warmer started",
            version=warmer.__version__,
            listen=f"http://{self.settings.api.host}:{self.settings.api.port}",
            boxes=len(self.boxes),
            profiles=len(self.profiles),
            agents=len(self.agents),
            database="embedded sqlite" if self.settings.database.is_embedded else "server",
        )
        self.metrics.up.set(1)
        try:
            code = await self.supervisor.run(handle_signals=handle_signals)
        finally:
            self.metrics.up.set(0)
            self.metrics.ready.set(0)
            store, self._store = self._store, None
            await store.close()
            self._release_database()
            await self.http.aclose()
        self._log.info("warmer stopped", exit_code=code, reason=self.supervisor.stop_reason)
        return code


class _DaemonStatus:
    """Status answers while the reconciler runs; 503 (StatusUnavailable) before and after. A daemon
    without boxes (configured or discovered) answers with an empty fleet."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def _service(self) -> StatusQueries | None:
        if not self._daemon.boxes and self._daemon.settings.fleet.discovery is None:
            return None
        reconciler, store = self._daemon.reconciler, self._daemon._store
        if reconciler is None or store is None:
            raise StatusUnavailable("the reconciler is not running (daemon starting or stopping)")
        return StatusService(reconciler, store)

    async def boxes(self) -> list[BoxView]:
        service = self._service()
        return [] if service is None else await service.boxes()

    async def box(self, box_id: str) -> BoxView | None:
        service = self._service()
        return None if service is None else await service.box(box_id)

    async def ready(self, box_id: str) -> ReadyView | None:
        service = self._service()
        return None if service is None else await service.ready(box_id)

    async def routes(self) -> list[AgentRoutes]:
        service = self._service()
        return [] if service is None else await service.routes()


def build(
    settings: Settings,
    *,
    profiles: Mapping[str, ModelProfile] | None = None,
    agents: Mapping[str, AgentSpec] | None = None,
    store_factory: StoreFactory = open_sql_store,
    prepare: DatabasePreparer = prepare_database,
    lock: DatabaseLocker = lock_sqlite_file,
    transport: httpx.AsyncBaseTransport | None = None,
) -> Daemon:
    """Wire a daemon from settings. Nothing starts until `Daemon.run()`."""
    profiles = profiles or {}
    timeouts = settings.engine_timeouts()
    http = httpx.AsyncClient(
        timeout=httpx.Timeout(timeouts.request, connect=timeouts.connect),
        transport=transport,
        follow_redirects=False,  # only ever call registered engine URLs, never where a redirect points
        headers={"user-agent": f"warmer/{warmer.__version__}"},
    )
    return Daemon(
        settings=settings,
        profiles=profiles,
        agents=agents or {},
        boxes=settings.box_specs(profiles),
        http=http,
        metrics=Metrics(),
        store_factory=store_factory,
        prepare=prepare,
        lock=lock,
    )
