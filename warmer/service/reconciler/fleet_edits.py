"""Fleet edits from deploy events and discovery: boxes added and removed, rollout drains and undrains.

A rollout drain hands a box's agents to the rest of the fleet before the box restarts; an undrain brings
it back as a new epoch (its epoch tag), so it is warmed again before any route uses it. Adding a box
registers it and it is warmed before any route uses it; removing one takes it out of every route at once,
cancels its engine work and drops its rows (the event log keeps its history).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from warmer.core.errors import ConfigError
from warmer.core.model import BoxSpec, ModelProfile
from warmer.ports import StorePort
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.desired import DesiredState
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth


def _known(boxes: Mapping[str, BoxSpec], box_ids: Sequence[str]) -> None:
    unknown = [box_id for box_id in box_ids if box_id not in boxes]
    if unknown:
        raise ConfigError([("box_ids", f"unknown boxes: {', '.join(unknown)}")])


class Rollout:
    """Boxes out of service for a rollout (box id -> why), and the tags that make a box's epoch new
    after one (box id -> tag, appended to the engine's epoch)."""

    def __init__(self, boxes: Mapping[str, BoxSpec]) -> None:
        self._boxes = boxes
        self._drained: dict[str, str] = {}
        self._epoch_tags: dict[str, str] = {}

    def drain(self, box_ids: Sequence[str], reason: str) -> None:
        """A rollout will restart these boxes: hand their agents to the rest of the fleet first.

        The boxes leave placement at once, so their agents are warmed on other boxes; move-before-switch
        keeps routing calls to a draining box until the agent is warm elsewhere, so no call meets a cold
        box while a warm one exists. A box is drained (`drained`) once no route uses it; it leaves every
        route at once when it goes down."""
        _known(self._boxes, box_ids)
        for box_id in box_ids:
            self._drained[box_id] = reason

    def undrain(self, box_ids: Sequence[str], epoch_tag: str) -> None:
        """Back in service as a NEW epoch (`<engine epoch>~<tag>`), even when the engine's own identity did
        not change: restart warm-up, then the prefixes, then the routes."""
        _known(self._boxes, box_ids)
        for box_id in box_ids:
            self._drained.pop(box_id, None)
            self._epoch_tags[box_id] = epoch_tag

    def is_draining(self, box_id: str) -> bool:
        return box_id in self._drained

    def draining(self) -> dict[str, str]:
        """Boxes taken out of service by a rollout, with why."""
        return dict(self._drained)

    def drained(self, routed: set[str]) -> frozenset[str]:
        """Draining boxes that no route uses any more (`routed`): safe to restart without a call meeting
        them."""
        return frozenset(box_id for box_id in self._drained if box_id not in routed)

    def epoch_tag(self, box_id: str) -> str | None:
        return self._epoch_tags.get(box_id)

    def forget_box(self, box_id: str) -> None:
        self._drained.pop(box_id, None)
        self._epoch_tags.pop(box_id, None)


class FleetEdits:
    """Adds and removes boxes under the fleet lock, so an edit never lands in the middle of a pass."""

    def __init__(
        self,
        *,
        store: StorePort,
        boxes: dict[str, BoxSpec],
        profiles: Mapping[str, ModelProfile],
        lock: asyncio.Lock,
        health: BoxHealth,
        book: WarmBook,
        runner: ActionRunner,
        desired: DesiredState,
        rollout: Rollout,
        notify_changed: Callable[[], None],
    ) -> None:
        self._store = store
        self._boxes = boxes
        self._profiles = profiles
        self._lock = lock
        self._health = health
        self._book = book
        self._runner = runner
        self._desired = desired
        self._rollout = rollout
        self._notify_changed = notify_changed

    async def add_box(self, box: BoxSpec) -> None:
        """A new box joins the fleet (registered in the store); it is warmed before any route uses it."""
        async with self._lock:
            if box.id in self._boxes:
                raise ConfigError([("box.id", f"box {box.id!r} is already registered")])
            if box.model not in self._profiles:
                raise ConfigError([("box.model", f"unknown model profile {box.model!r}")])
            self._boxes[box.id] = box
            self._health.add_box(box.id)
            await self._store.sync_boxes(list(self._boxes.values()))

    async def remove_box(self, box_id: str) -> None:
        """A box leaves the fleet: out of routes at once, its engine work cancelled, its rows dropped
        (the event log keeps its history)."""
        async with self._lock:
            if box_id not in self._boxes:
                raise ConfigError([("box_id", f"unknown box {box_id!r}")])
            await self._runner.cancel_box(box_id)
            del self._boxes[box_id]
            self._health.forget_box(box_id)
            self._rollout.forget_box(box_id)
            self._book.forget_box(box_id)
            self._desired.forget_box(box_id)
            await self._store.sync_boxes(list(self._boxes.values()))
        self._notify_changed()
