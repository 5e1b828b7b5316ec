"""Slots for side requests: a dialer's requests that are no agent's call (a transcript summary, a classifier).

On an engine whose requests name a slot (llama.cpp `id_slot`), an unslotted request goes where the engine
likes: into the least recently used idle slot, or the one whose cached prompt looks most like it. Either way
it overwrites a prefix warmer may be vouching for, and nobody tells warmer, so a later "ready" answer for that
prefix is false. Asked first, warmer names the slot: one no prefix holds, else the least valuable prefix's
(calls a minute x tokens); never a slot with work in flight or a prefix answered ready within the protection
window (within a first turn's time, when that leaves none), and a slot a call may still be sending turns to
only when every other slot has one. The prefix it evicts is not vouched for again until verified after the
lend (`WarmBook.at_risk`), and a probe is sent to its slot once the side request has had time to reach the
engine, so it is warm again (or known cold, and re-warmed) before its next call.

Engines without slots (vLLM, SGLang) evict least recently used blocks, which warmer's keep-alive and KV
events already follow: there the answer names no slot and nothing is noted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import structlog

from warmer.core.model import BoxSpec
from warmer.core.placement.loans import prefix_value, side_slot
from warmer.ports import Clock
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.desired import DesiredState
from warmer.service.reconciler.precall import FIRST_TURN_SECONDS
from warmer.service.reconciler.records import SIDE_REQUEST_START_SECONDS, WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth

# How often a side-slot ask that waits looks again (protection is by time, in-flight work ends by itself).
SIDE_RETRY_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class SideSlot:
    """Where a side request should go on `box_id`: `slot` (None: send it unslotted), and the agent whose
    prefix gives its slot up (None: a slot no prefix held, or no slot named)."""

    box_id: str
    slot: int | None
    evicts: str | None
    detail: str


class UnknownSideBox(LookupError):
    """The box is not in the fleet."""


class SideRequests:
    """`lend(box)`: the slot a side request should name on the box, noted so no answer vouches for what it
    overwrites."""

    def __init__(
        self,
        *,
        clock: Clock,
        boxes: Mapping[str, BoxSpec],
        health: BoxHealth,
        book: WarmBook,
        desired: DesiredState,
        runner: ActionRunner,
        answered_within: Callable[[float], frozenset[str]],
        protect_seconds: float,
        call_hold_seconds: float,
        owns: Callable[[str], bool] = lambda _box_id: True,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._clock = clock
        self._boxes = boxes
        self._health = health
        self._book = book
        self._desired = desired
        self._runner = runner
        self._answered_within = answered_within
        self._protect_seconds = protect_seconds
        self._call_hold_seconds = call_hold_seconds
        self._owns = owns
        self._log = log
        self._pending: set[asyncio.Task[None]] = set()

    async def lend(self, box_id: str, wait_seconds: float = 0.0) -> SideSlot:
        """The slot to name, lent now; when every slot is protected, looked at again until one is free or
        `wait_seconds` have passed (a first turn reaches its slot, work in flight finishes)."""
        if box_id not in self._boxes:
            raise UnknownSideBox(box_id)
        deadline = self._clock.monotonic() + max(0.0, wait_seconds)
        while True:
            lent = self._try_lend(box_id)
            if lent is not None:
                return lent
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                self._log.info("no slot to lend a side request", box=box_id, waited_seconds=wait_seconds)
                why = "every slot has work in flight or a prefix just answered ready"
                return SideSlot(box_id, None, None, why)
            await self._clock.sleep(min(remaining, SIDE_RETRY_SECONDS))

    def _try_lend(self, box_id: str) -> SideSlot | None:
        """The slot lent now, the answer for a box with no slot to name, or None: every slot is protected."""
        live = self._health.live.get(box_id)
        capacity = self._health.capacity.get(box_id)
        epoch = live.epoch if live is not None else None
        if epoch is None or capacity is None or not capacity.pinnable_slots:
            return SideSlot(box_id, None, None, "no slot to name: send it unslotted")
        desired = self._desired.current
        refs = desired.agents if desired is not None else {}
        agent_of = {ref.hash: agent for agent, ref in refs.items()}
        now = self._clock.now()
        pinned: dict[int, str] = {}
        busy: set[int] = set()  # work in flight: a side request named there would land after it
        for (pin_box, pin_epoch, prefix_hash), slot in self._book.pins.items():
            if pin_box != box_id or pin_epoch != epoch:
                continue
            pinned[slot] = agent_of.get(prefix_hash, prefix_hash)
            if (box_id, prefix_hash) in self._runner.in_flight:
                busy.add(slot)
        in_call = {
            slot
            for slot in range(capacity.pinnable_slots)
            if self._book.slot_in_call(box_id, epoch, slot, now, self._call_hold_seconds)
        }

        def value(agent: str) -> float:
            ref = refs.get(agent)
            if ref is None or self._book.at_risk((box_id, epoch, ref.hash), now, self._call_hold_seconds):
                return 0.0  # not vouched for now (lent already, or contested): lending it costs nothing more
            return prefix_value(self._desired.volume.get(agent, 0.0), ref.tokens)

        # A prefix answered ready within the protection window keeps its slot; when that leaves none, one
        # answered longer ago than a first turn takes gives it (as lending room to a call does: `precall`).
        chosen = None
        for window in dict.fromkeys((self._protect_seconds, min(FIRST_TURN_SECONDS, self._protect_seconds))):
            answered = self._answered_within(window)
            protected = busy | {slot for slot, agent in pinned.items() if agent in answered}
            chosen = side_slot(capacity.pinnable_slots, pinned, value, protected, in_call)
            if chosen is not None:
                break
        if chosen is None:
            return None
        slot, victim = chosen
        self._book.note_side_use(box_id, epoch, slot, now)
        if victim is not None and victim in refs:
            self._recheck_later(box_id, epoch, refs[victim].hash, victim)
        self._log.info("slot lent to a side request", box=box_id, slot=slot, evicts=victim)
        detail = "a slot no prefix holds" if victim is None else f"evicts {victim}'s prefix (least valuable)"
        return SideSlot(box_id, slot, victim, detail)

    def _recheck_later(self, box_id: str, epoch: str, prefix_hash: str, agent: str) -> None:
        """A probe of the victim's slot once the side request is there (it waits for the slot): warm again
        if the dialer sent nothing, else seen cold and re-warmed by the next pass."""

        async def probe() -> None:
            await self._clock.sleep(SIDE_REQUEST_START_SECONDS)
            live = self._health.live.get(box_id)
            if live is None or live.epoch != epoch or not self._owns(box_id):
                return
            self._runner.start_engine_work(
                box_id, epoch, prefix_hash, "probe: slot lent to a side request", probe=True, agents=(agent,)
            )

        task = asyncio.get_running_loop().create_task(probe(), name=f"side-recheck:{box_id}:{prefix_hash}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def close(self) -> None:
        """Cancel the probes not sent yet (the daemon stops)."""
        for task in self._pending:
            task.cancel()
        self._pending.clear()
