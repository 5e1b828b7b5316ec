"""Wiring of several replicas: the coordination store over the daemon's SqlStore, this replica's lease
holder and the reconciler's gate, and their root tasks (`leases`: the heartbeat; `changes`: LISTEN on
PostgreSQL, waking the reconcile loop and the heartbeat when another replica wrote something).

Built for every SQL store: on SQLite (one daemon per file) the replica trivially holds every box, through
the same code, so one path is tested everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence

from warmer.adapters.store import SqlStore
from warmer.adapters.store.coordination import SqlCoordination
from warmer.adapters.store.notify import listen_for_changes
from warmer.config.settings import Settings
from warmer.core.leases import LeaseConfig
from warmer.core.model import BoxSpec
from warmer.ports import Clock
from warmer.root.logging import get_logger
from warmer.service.ownership import BoxOwnership
from warmer.service.replica_gate import ReplicaGate


def lease_config(settings: Settings) -> LeaseConfig:
    replicas = settings.replicas
    return LeaseConfig(lease_seconds=replicas.lease_seconds, renew_seconds=replicas.renew_seconds)


class ReplicaWiring:
    """The pieces one replica runs; `wake` is what a notification from another replica calls."""

    def __init__(
        self,
        settings: Settings,
        store: SqlStore,
        *,
        clock: Clock,
        configured: Sequence[BoxSpec],
        fleet: Callable[[], Collection[str]],
        on_change: Callable[[], None],
        on_leases: Callable[[frozenset[str], frozenset[str]], None] | None = None,
    ) -> None:
        self._url = settings.database_url()
        self._on_change = on_change
        self.coordination = SqlCoordination(store)
        self.ownership = BoxOwnership(
            coordination=self.coordination,
            clock=clock,
            config=lease_config(settings),
            fleet=fleet,
            replica_id=settings.replicas.replica_id,
            on_change=on_leases,
        )
        self.gate = ReplicaGate(
            ownership=self.ownership, coordination=self.coordination, configured=configured
        )

    @property
    def listens(self) -> bool:
        return self.coordination.notifies

    def wake(self, what: str) -> None:
        """Another replica wrote leases or deploy state: heartbeat soon, and run a pass."""
        if what in ("leases", "listening"):
            self.ownership.wake()
        self._on_change()

    async def run_leases(self, stopping: asyncio.Event) -> None:
        await self.ownership.run(stopping)

    async def run_listener(self, stopping: asyncio.Event) -> None:
        log = get_logger(__name__)
        await listen_for_changes(
            self._url, self.wake, stopping, on_trouble=lambda message: log.warning(message)
        )
