"""The composition root: `build(settings) -> Daemon` takes the settings, the HTTP client and the metrics;
`Daemon.run()` prepares the database, opens the store, builds the reconciler and every service over it,
then supervises the named root tasks until a signal.

Everything I/O is created here and nowhere else, and every piece is injectable (store factory, database
preparation, HTTP transport) so tests swap real parts for fakes at our own seams.

Size: the one place every service and root task is built and wired, in the order they are built; what each
piece does lives in the warmer.root module it comes from.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence

import httpx
import uvicorn
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

import warmer
from warmer.adapters.engines.http import count_control_requests
from warmer.adapters.store.filelock import SqliteFileLock
from warmer.api import ApiServices, Liveness, Readiness, create_app
from warmer.config.fleet_settings import GatewaySettings
from warmer.config.settings import Settings
from warmer.core.agents import AgentSpec
from warmer.core.model import BoxSpec, ModelProfile
from warmer.root.capacity import OfflineStablePrefixes, capacity_config, run_capacity_gauges
from warmer.root.database import (
    DatabaseLocker,
    DatabasePreparer,
    ManagedStore,
    StoreFactory,
    lock_sqlite_file,
    open_sql_store,
    prepare_database,
)
from warmer.root.deploy import build_deploy_service
from warmer.root.dialer import DialerWiring
from warmer.root.discovery import run_discovery
from warmer.root.engines import SystemClock, build_engine_dispatcher, engine_http_client
from warmer.root.frontdoor import build_gateway, hitrate_config
from warmer.root.heap import freeze_startup_heap, freeze_when_fleet_ready
from warmer.root.kv_events import cache_event_task, follows_events
from warmer.root.logging import get_logger
from warmer.root.metrics import Metrics
from warmer.root.reconcile import OfflinePrefixSource, reconciler_config, run_timers
from warmer.root.replicas import ReplicaWiring
from warmer.root.server import api_server
from warmer.root.supervisor import Supervisor
from warmer.root.tracing import trace_client, tracer_provider
from warmer.service.dialer.call_spread import CallVolumeMeter
from warmer.service.dialer.usage import UsageService, UsageWindowConfig
from warmer.service.engine_signals.hitrate_monitor import HitRateMonitor
from warmer.service.engine_work.restart_warmup import RestartWarmup
from warmer.service.fleet.gateway_sync import GatewaySync
from warmer.service.loop_lag import DEFAULT_PERIOD_SECONDS as LOOP_LAG_PERIOD_SECONDS
from warmer.service.loop_lag import sample_loop_lag
from warmer.service.reconciler import Reconciler
from warmer.service.views.capacity import CapacityService, PrefillCeilings
from warmer.service.views.status import StatusService

# How long /readyz waits for the database to answer before calling it unreachable (seconds).
READINESS_DB_TIMEOUT_SECONDS = 2.0


class Daemon:
    """The running warmer: the API server, the reconciler and its companions, as supervised root tasks.

    `run()` builds it in order: take the database's lock, prepare the database, open the store, build the
    reconciler and every service over it (`wire`), then start the supervisor's named root tasks. Nothing
    waits for anything to be built: whatever a task or an API route needs exists before any of them runs.
    """

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
        tracing: TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.tracing = tracing  # flushed and shut down in close()
        self.profiles = profiles
        self.agents = agents
        self.boxes = tuple(boxes)
        self.http = http
        self.metrics = metrics
        count_control_requests(http, lambda kind: metrics.engine_control_requests.labels(kind=kind).inc())
        self._store_factory = store_factory
        self._prepare = prepare
        self._lock_database = lock
        self._database_lock: SqliteFileLock | None = None  # held from start-up to exit
        self._store: ManagedStore | None = None
        self._server: uvicorn.Server | None = None
        self._reconciler: Reconciler | None = None  # built with the fleet (`wire`)
        self._api: FastAPI | None = None
        self._log = get_logger(__name__)
        # Prefill ceilings measured by the restart warm-ups' long prefills, per box and epoch.
        self.prefill_ceilings = PrefillCeilings()
        self.supervisor = Supervisor(
            grace_seconds=settings.reconcile.shutdown_grace_seconds,
            on_task_failure=lambda name: metrics.root_task_failures.labels(task=name).inc(),
        )

    @property
    def has_fleet(self) -> bool:
        """Configured boxes or discovery: without either there is nothing to reconcile."""
        return bool(self.boxes) or self.settings.fleet.discovery is not None

    def wire(self, store: ManagedStore) -> None:
        """Build the reconciler and every service over the open `store`, and register the root tasks,
        each with its failure series at 0 from the start: a task that fails once and stops the daemon
        before the next scrape still shows as an increase (a series born at 1 never does)."""
        self._wire(store)
        for name in self.supervisor.task_names:
            self.metrics.root_task_failures.labels(task=name)

    def _wire(self, store: ManagedStore) -> None:
        settings, clock = self.settings, SystemClock()
        self._store = store
        engines = build_engine_dispatcher(settings, self.http, boxes=self.boxes, profiles=self.profiles)
        meter = CallVolumeMeter(clock, window_seconds=settings.dialer.volume_window_seconds)
        replicas = ReplicaWiring(settings, store, clock=clock)  # leases and shared deploy state
        reconciler = Reconciler(
            engine=engines,
            store=store,
            clock=clock,
            boxes=self.boxes,
            profiles=self.profiles,
            agents=self.agents,
            prefix_source=OfflinePrefixSource(),
            config=reconciler_config(settings),
            observer=self.metrics.reconcile,
            demand=meter.calls_per_minute,
            # The reconciler's default warm-up, plus the long prefill's report for the capacity figures.
            restart=RestartWarmup(
                engines, store, clock, on_long_prefill=self.prefill_ceilings.record_long_prefill
            ),
            replicas=replicas.gate,
            on_fleet_change=engines.register,
        )
        replicas.attach(reconciler, lambda: reconciler.fleet().keys())
        dialer = DialerWiring(
            settings, agents=self.agents.keys, store=store, reconciler=reconciler, meter=meter
        )
        monitor = self._hitrate_monitor(reconciler) if self.has_fleet else None
        # Stable prefixes computed offline as `warmer lint` does: capacity's per-call tokens, usage's depth.
        stable = OfflineStablePrefixes(lambda: self.agents, self.profiles)
        usage = UsageService(
            clock=clock,
            agents=self.agents.keys,
            boxes=lambda: reconciler.fleet().keys(),
            stable_share=stable.stable_share,
            config=UsageWindowConfig(settings.usage.window_records, settings.usage.window_seconds),
        )
        self.metrics.usage.attach(usage.report)
        capacity = CapacityService(
            snapshot=reconciler.snapshot,
            usage=monitor,
            ceilings=self.prefill_ceilings,
            profiles=self.profiles,
            store=store,
            clock=clock,
            config=capacity_config(settings),
            per_call_tokens=stable.call_tokens,
            observer=self.metrics.capacity,
        )
        self._api = create_app(
            ApiServices(
                registry=self.metrics.registry,
                readiness=self.readiness,
                tokens=tuple(settings.api.tokens),
                status=StatusService(reconciler, store),
                # Without a fleet no reconciler runs: nothing could act on a pre-call ask or a deploy event.
                prewarm=dialer.prewarm if self.has_fleet else None,
                campaigns=dialer.campaigns,
                deploy=build_deploy_service(
                    settings,
                    store=store,
                    fleet=reconciler,
                    clock=clock,
                    on_fleet_change=engines.register,
                    shared=replicas.coordination,
                )
                if self.has_fleet
                else None,
                max_request_bytes=settings.api.max_request_bytes,
                webhook_max_body_bytes=settings.api.webhook_max_body_bytes,
                capacity=capacity if self.boxes else None,
                requests=self.metrics.http,
                liveness=functools.partial(self.liveness, reconciler),
                tracer_provider=self.tracing,
                usage=usage,
            )
        )

        self.supervisor.add("api", self._serve_api)
        lag = functools.partial(
            sample_loop_lag, clock, LOOP_LAG_PERIOD_SECONDS, self.metrics.loop_lag.observe
        )
        self.supervisor.add("loop-lag", lag)
        if not self.has_fleet:
            return
        self._reconciler = reconciler
        for name, task in replicas.tasks(reconciler.run).items():
            self.supervisor.add(name, task)
        self.supervisor.add(
            "scheduler", functools.partial(run_timers, settings, reconciler.poke, reconciler.poll_health)
        )
        if dialer.schedule is not None:
            self.supervisor.add("schedule", dialer.run_schedule)
        assert monitor is not None  # built with the fleet
        self.supervisor.add("hitrate", monitor.run)
        gauges = functools.partial(run_capacity_gauges, capacity, clock, settings.hitrate.poll_seconds)
        self.supervisor.add("capacity", gauges)
        if follows_events(self.boxes):
            events = cache_event_task(
                fleet=reconciler.fleet, reactions=reconciler.evictions, engine=engines, clock=clock
            )
            self.supervisor.add("kv-events", events)
        if settings.fleet.gateway is not None:
            self.supervisor.add("gateway-sync", self._gateway_sync(settings.fleet.gateway, reconciler).run)
        if settings.fleet.discovery is not None:
            discovery = functools.partial(
                run_discovery,
                settings.fleet.discovery,
                self.profiles,
                reconciler,
                engines.register,
                self.metrics.discovery,
            )
            self.supervisor.add("discovery", discovery)

    @staticmethod
    def _heap_task(reconciler: Reconciler) -> Callable[[asyncio.Event], Awaitable[None]]:
        def all_ready() -> bool:
            ready = reconciler.ready_box_ids()
            return ready is not None and set(reconciler.fleet()) <= ready

        return functools.partial(freeze_when_fleet_ready, all_ready, reconciler.wait_changed)

    def _hitrate_monitor(self, reconciler: Reconciler) -> HitRateMonitor:
        """Per-box hit rate from the engines' counters; a drop marks the box suspect for the reconciler.
        Its own engine client, told the fleet's boxes each time it reads them."""
        engines = build_engine_dispatcher(self.settings, self.http, boxes=self.boxes, profiles=self.profiles)

        def fleet() -> Sequence[BoxSpec]:
            boxes = tuple(reconciler.fleet().values())
            engines.register(boxes)
            return boxes

        return HitRateMonitor(
            engine=engines,
            fleet=fleet,
            clock=SystemClock(),
            config=hitrate_config(self.settings),
            observer=self.metrics.hitrate,
            suspects=reconciler,
            ready_boxes=reconciler.ready_box_ids,
        )

    def _gateway_sync(self, gateway: GatewaySettings, reconciler: Reconciler) -> GatewaySync:
        """Register ready boxes with `[fleet.gateway]`, withdraw the others (a router outage is retried)."""
        return GatewaySync(
            gateway=build_gateway(gateway, self.http),
            fleet=lambda: tuple(reconciler.fleet().values()),
            readiness=reconciler,
            clock=SystemClock(),
            interval_seconds=gateway.sync_seconds,
            observer=self.metrics.gateway,
        )

    @property
    def api(self) -> FastAPI:
        """The HTTP app; built by `open()` (or `run()`) once the store is open."""
        if self._api is None:
            raise RuntimeError("the API is built once the store is open (Daemon.open)")
        return self._api

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

    def liveness(self, reconciler: Reconciler) -> Liveness:
        """Alive unless the reconcile loop runs (there is a fleet) and has not finished a pass for
        reconcile.stall_seconds."""
        stalled = reconciler.stalled(self.settings.reconcile.stall_seconds) if self.has_fleet else None
        return Liveness(stalled is None, stalled or "")

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

    async def open(self) -> None:
        """Everything `run()` does before the root tasks start: lock and prepare the database, open the
        store, build the reconciler, the services and the API. `close()` releases it all."""
        self._database_lock = self._lock_database(self.settings)
        await asyncio.to_thread(self._prepare, self.settings)
        self.wire(self._store_factory(self.settings))

    async def close(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()
        self._release_database()
        await self.http.aclose()
        if self.tracing is not None:
            self.tracing.shutdown()  # exports what is still queued

    async def run(self, *, handle_signals: bool = True, freeze_heap: bool = False) -> int:
        """Prepare the database, open the store, build everything, serve until stopped. Returns the process
        exit code. `freeze_heap` (a `warmer serve` process): once built, what is alive is frozen out of
        the garbage collector's full collections (`warmer.root.heap`)."""
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
                await self.close()
                return 0
            preparing.result()
            self.wire(self._store_factory(self.settings))
        except Exception as exc:
            self._log.error("startup failed", error=f"{type(exc).__name__}: {exc}")
            await self.close()
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
        if freeze_heap:
            self._log.info("start-up heap frozen", objects=freeze_startup_heap())
            if self._reconciler is not None:  # and again once the fleet is first ready
                self.supervisor.add("heap", self._heap_task(self._reconciler))
                self.metrics.root_task_failures.labels(task="heap")
        self.metrics.up.set(1)
        try:
            code = await self.supervisor.run(handle_signals=handle_signals)
        finally:
            self.metrics.up.set(0)
            self.metrics.ready.set(0)
            await self.close()
        self._log.info("warmer stopped", exit_code=code, reason=self.supervisor.stop_reason)
        return code


def build(
    settings: Settings,
    *,
    profiles: Mapping[str, ModelProfile] | None = None,
    agents: Mapping[str, AgentSpec] | None = None,
    store_factory: StoreFactory = open_sql_store,
    prepare: DatabasePreparer = prepare_database,
    lock: DatabaseLocker = lock_sqlite_file,
    transport: httpx.AsyncBaseTransport | None = None,
    span_exporter: SpanExporter | None = None,
) -> Daemon:
    """Wire a daemon from settings. Nothing starts until `Daemon.run()`. `span_exporter` replaces OTLP
    when `[tracing]` is on (tests)."""
    profiles = profiles or {}
    http = engine_http_client(settings, transport=transport)
    tracing = tracer_provider(settings.tracing, span_exporter)
    trace_client(http, tracing)
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
        tracing=tracing,
    )
