"""Deploy events as shared state: the real DeployService over a real SqlCoordination (temp SQLite) writes a
rollout or fleet change with its event id in one transaction, so a second replica sees it in the store
and the same event sent there is a duplicate that changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.unit.reconciler_fakes import World, agent, settle, world
from warmer.adapters.store import SqlStore, upgrade_database
from warmer.adapters.store.coordination import SqlCoordination
from warmer.core.shared_state import SharedFleetState
from warmer.core.webhook import BoxUrlPolicy, sign_body
from warmer.service.fleet.deploy import (
    DeployOutcome,
    DeployResult,
    DeployService,
    WebhookConfig,
    rollout_drain_reason,
    rollout_epoch_tag,
)

SECRET = "deploy-secret"
ALLOWED = ("http://10.0.9.*:8080",)


def event(kind: str, event_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": event_id, "kind": kind, "occurred_at": "2025-01-31T12:00:00Z", **fields}


class Replica:
    """One daemon's deploy service and reconciler over the shared database file."""

    def __init__(self, url: str) -> None:
        self.world: World = world(url, specs={"sales": agent("sales", "You sell things.")})
        self.coordination = SqlCoordination(SqlStore.from_url(url))
        self.service = DeployService(
            store=self.world.store,
            clock=self.world.clock,
            config=WebhookConfig(secrets=(SECRET,), box_url_policy=BoxUrlPolicy(ALLOWED)),
            fleet=self.world.reconciler,
            shared=self.coordination,
        )

    def send(self, payload: Mapping[str, Any]) -> DeployResult:
        body = json.dumps(payload).encode()
        signature = sign_body(body, SECRET, int(self.world.clock.now()))
        return asyncio.run(self.service.handle(body, signature))

    def shared(self) -> SharedFleetState:
        return asyncio.run(self.coordination.shared_state())


@pytest.fixture
def replicas(tmp_path: Path) -> tuple[Replica, Replica]:
    url = f"sqlite:///{tmp_path / 'warmer.db'}"
    upgrade_database(url)
    pair = (Replica(url), Replica(url))
    for replica in pair:
        asyncio.run(settle(replica.world.reconciler))
    return pair


def test_a_rollout_is_written_with_its_event_id_and_is_a_duplicate_elsewhere(
    replicas: tuple[Replica, Replica],
) -> None:
    first, second = replicas
    started = event("rollout.started", "ev-1", box_ids=["b1"])
    assert first.send(started).outcome is DeployOutcome.ACCEPTED
    assert second.shared().drains() == {"b1": rollout_drain_reason("ev-1")}
    assert first.world.reconciler.draining() == {"b1": rollout_drain_reason("ev-1")}  # here at once

    repeat = second.send(started)
    assert repeat.outcome is DeployOutcome.DUPLICATE
    assert second.world.reconciler.draining() == {}  # the repeat changed nothing there

    assert second.send(event("rollout.finished", "ev-2", box_ids=["b1"])).outcome is DeployOutcome.ACCEPTED
    state = first.shared()
    assert state.drains() == {}
    assert state.epoch_tags() == {"b1": rollout_epoch_tag("ev-2")}


def test_fleet_changes_are_shared(replicas: tuple[Replica, Replica]) -> None:
    first, second = replicas
    added = event(
        "box.added",
        "ev-add",
        box={"id": "b3", "base_url": "http://10.0.9.3:8080", "engine": "llamacpp", "model": "m"},
    )
    assert first.send(added).outcome is DeployOutcome.ACCEPTED
    assert second.send(event("box.removed", "ev-rm", box_id="b2")).outcome is DeployOutcome.ACCEPTED
    state = first.shared()
    added_box = state.changes["b3"].added
    assert added_box is not None
    assert added_box.base_url == "http://10.0.9.3:8080"
    assert state.changes["b2"].added is None
    assert [box.id for box in state.fleet(list(first.world.reconciler.fleet().values()))] == ["b1", "b3"]


def test_an_invalid_rollout_writes_no_shared_state(replicas: tuple[Replica, Replica]) -> None:
    first, _ = replicas
    result = first.send(event("rollout.started", "ev-bad", box_ids=["nope"]))
    assert result.outcome is DeployOutcome.INVALID
    assert first.shared() == SharedFleetState()
    assert first.send(event("rollout.started", "ev-bad", box_ids=["b1"])).outcome is DeployOutcome.DUPLICATE
