"""Wiring of several replicas: the coordination store over the daemon's SqlStore, this replica's lease
holder and the reconciler's gate, and their root tasks.

On PostgreSQL: `BoxOwnership` heartbeats (root task `leases`), each box's health polled by its lease
holder only and read by the others from the store (`SqlHealthExchange`), and a LISTEN connection (root task
`changes`) that wakes the reconcile loop and the heartbeat when another replica wrote leases, deploy state
or a changed health observation.
On SQLite (one daemon per file, held under its lock): `SoleOwnership`, every box trivially held; the
shared deploy state is still read from the store, so a restarted daemon keeps a rollout in progress.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from warmer.adapters.store import SqlStore
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.notify import listen_for_changes
from warmer.adapters.store.observations import SqlHealthExchange
from warmer.config.settings import Settings
from warmer.core.leases import LeaseConfig
from warmer.ports import Clock
from warmer.root.logging import get_logger
from warmer.service.replicas.ownership import BoxOwnership, SoleOwnership
from warmer.service.replicas.replica_gate import ReplicaGate

RunTask = Callable[[asyncio.Event], Awaitable[None]]


def lease_config(settings: Settings) -> LeaseConfig:
    replicas = settings.replicas
    return LeaseConfig(lease_seconds=replicas.lease_seconds, renew_seconds=replicas.renew_seconds)


class ReplicaParts(Protocol):
    """The reconciler's replica part (`warmer.service.reconciler.replicas.ReplicaSync`)."""

    def busy(self) -> frozenset[str]: ...

    def leases_changed(self, gained: frozenset[str], lost: frozenset[str]) -> None: ...


class ReplicaAware(Protocol):
    """What the wiring tells the reconciler (`warmer.service.reconciler.Reconciler`)."""

    @property
    def replicas(self) -> ReplicaParts: ...

    def poke(self) -> None: ...


class ReplicaWiring:
    """The pieces one replica runs. `attach` the reconciler once it is built (it takes `gate`); `tasks`
    are its root tasks."""

    def __init__(self, settings: Settings, store: object, *, clock: Clock) -> None:
        self._url = settings.database_url()
        self._reconciler: ReplicaAware | None = None
        self._fleet: Callable[[], Collection[str]] = lambda: ()
        self._reconciler_done = asyncio.Event()
        # over any other store (a test's fake): one daemon, no gate, nothing shared
        sql = store if isinstance(store, SqlStore) else None
        self.coordination = SqlCoordination(sql) if sql is not None else None
        self.ownership: BoxOwnership | None = None
        self.gate: ReplicaGate | None = None
        if sql is None or self.coordination is None:
            return
        holder: BoxOwnership | SoleOwnership
        health: SqlHealthExchange | None = None
        if self.coordination.notifies:  # a server database: replicas may share it
            health = SqlHealthExchange(sql)  # each box's health polled by its holder only
            holder = self.ownership = BoxOwnership(
                coordination=self.coordination,
                clock=clock,
                config=lease_config(settings),
                fleet=lambda: self._fleet(),
                replica_id=settings.replicas.replica_id,
                on_change=self._leases_changed,
                busy=lambda: () if self._reconciler is None else self._reconciler.replicas.busy(),
            )
            sql.fence_box_writes(holder.replica_id)  # a box's rows only while this replica holds it
        else:
            holder = SoleOwnership(settings.replicas.replica_id)
        self.gate = ReplicaGate(
            ownership=holder,
            coordination=self.coordination,
            health=health,
            stale_after_seconds=settings.replicas.observation_stale_seconds,
        )

    def attach(self, reconciler: ReplicaAware, fleet: Callable[[], Collection[str]]) -> None:
        self._reconciler, self._fleet = reconciler, fleet

    def tasks(self, reconciler_run: RunTask) -> dict[str, RunTask]:
        """The root tasks: the reconciler (noting when it stopped), and on PostgreSQL `leases` and
        `changes`. Leases are handed back only after the reconciler cancelled its work."""

        async def run_reconciler(stopping: asyncio.Event) -> None:
            try:
                await reconciler_run(stopping)
            finally:
                self._reconciler_done.set()

        tasks: dict[str, RunTask] = {"reconciler": run_reconciler}
        if self.ownership is not None:
            tasks["leases"] = self._run_leases
            tasks["changes"] = self._run_listener
        return tasks

    def _leases_changed(self, gained: frozenset[str], lost: frozenset[str]) -> None:
        if self._reconciler is not None:
            self._reconciler.replicas.leases_changed(gained, lost)

    def wake(self, what: str) -> None:
        """Another replica wrote leases or deploy state: heartbeat soon, and run a pass."""
        if self.ownership is not None and what in ("leases", "listening"):
            self.ownership.wake()
        if self._reconciler is not None:
            self._reconciler.poke()

    async def _run_leases(self, stopping: asyncio.Event) -> None:
        assert self.ownership is not None
        await self.ownership.run(stopping, before_release=self._reconciler_done.wait)

    async def _run_listener(self, stopping: asyncio.Event) -> None:
        log = get_logger(__name__)
        await listen_for_changes(
            self._url, self.wake, stopping, on_trouble=lambda message: log.warning(message)
        )
