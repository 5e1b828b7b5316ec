"""Pre-call ensure: the box a call for an agent should use, warming the agent's prefix there if needed.

An ask marks the agent as active and holds it at top priority for `precall_hold_seconds`. When the agent
has a route, the answer is immediate and wakes no pass (a pass per ask would cost CPU per call);
otherwise the warm on the agent's best box is started or joined (coalesced with the loop's own) and
awaited up to the caller's bound. Waiting asks are answered when any engine work finishes, not at the end
of the next pass: a box of the agent's group where its prefix was just verified warm is a route at once
(the next pass's handover joins it to the routing for the same reason). With no box of its group able
to take the call, a cold stand-in of its model is named rather than no box at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from warmer.core.agents import AgentSpec
from warmer.core.model import BoxSpec, WarmState
from warmer.core.placement import stable_seed
from warmer.core.planner import WarmupStatus
from warmer.core.readiness import Route
from warmer.core.warmstate import is_serving, retry_at
from warmer.ports import Clock
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.activity import AgentActivity
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.desired import DesiredState
from warmer.service.reconciler.fleet_edits import Rollout
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.types import EnsureResult, ReconcilerConfig, UnknownAgent


class PrecallWarming:
    """`ensure_warm(agent, wait)`: the pre-call ask's answer, after at most `wait` seconds."""

    def __init__(
        self,
        *,
        clock: Clock,
        config: ReconcilerConfig,
        boxes: Mapping[str, BoxSpec],
        agents: Mapping[str, AgentSpec],
        activity: AgentActivity,
        catalogue: PrefixCatalogue,
        desired: DesiredState,
        health: BoxHealth,
        book: WarmBook,
        runner: ActionRunner,
        rollout: Rollout,
        routes_for: Callable[[str], tuple[Route, ...]],
        joining_routes_for: Callable[[str], tuple[Route, ...]],
        poke: Callable[[], None],
        changed: Callable[[], asyncio.Event],
        owns: Callable[[str], bool] = lambda _box_id: True,
    ) -> None:
        self._clock = clock
        self._config = config
        self._boxes = boxes
        self._agents = agents
        self._activity = activity
        self._catalogue = catalogue
        self._desired = desired
        self._health = health
        self._book = book
        self._runner = runner
        self._rollout = rollout
        self._routes_for = routes_for
        self._joining_routes_for = joining_routes_for
        self._poke = poke
        self._changed = changed  # the event the next pass sets
        self._owns = owns  # engine work only on boxes this replica holds the lease of

    async def ensure_warm(self, agent_id: str, wait_seconds: float = 0.0) -> EnsureResult:
        """Returns at once when a route exists; otherwise starts (or joins: coalesced) the warm on the
        agent's best box and waits up to `wait_seconds` for it to be verified and routed."""
        if agent_id not in self._agents:
            raise UnknownAgent(agent_id)
        self._activity.precall(agent_id, self._clock.now())
        deadline = self._clock.monotonic() + max(0.0, wait_seconds)
        woken = False
        while True:
            result, waiter = self._step(agent_id)
            if result.routed:
                return result  # warm: nothing for the loop to do, so no pass (a pass per ask is CPU per call)
            if not woken:
                self._poke()
                woken = True
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return result
            if waiter is None:  # wake on the next pass
                waiter = asyncio.ensure_future(self._changed().wait())
                owned = True
            else:
                owned = False  # a shared in-flight warm: never cancel it
            # ...or as soon as any engine work finishes: a warm verified on another box of the group
            # answers the ask at once, not at the end of the pass that follows it.
            finished = asyncio.ensure_future(self._runner.work_finished().wait())
            done, _ = await asyncio.wait(
                {waiter, finished}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            finished.cancel()
            if owned:
                waiter.cancel()
            if not done:
                return self._step(agent_id)[0]

    def _step(self, agent_id: str) -> tuple[EnsureResult, asyncio.Future[Any] | None]:
        """One look at the agent: (answer now, what to wait for next; None = the next change)."""
        computed = self._catalogue.get(agent_id)
        desired = self._desired.current
        if computed is None or desired is None:
            detail = self._catalogue.errors.get(agent_id, "prefix not computed yet")
            return EnsureResult(agent_id, None, None, False, None, detail), None
        prefix_hash = computed.prefix.hash
        now = self._clock.now()
        found = self._routes_for(agent_id) or self._joining_routes_for(agent_id)
        if found:
            answer = EnsureResult(agent_id, found[0].box_id, WarmState.WARM, True, prefix_hash, "warm", found)
            return answer, None
        first: EnsureResult | None = None
        for box_id in desired.assignment.get(agent_id, ()):
            live = self._health.live[box_id]
            if not live.healthy or live.epoch is None or live.warmup is not WarmupStatus.DONE:
                continue
            record = self._book.get((box_id, live.epoch, prefix_hash))
            state = record.state if record is not None else WarmState.COLD
            waiting = self._runner.in_flight.get((box_id, prefix_hash))
            if waiting is not None:
                return EnsureResult(
                    agent_id, box_id, WarmState.WARMING, False, prefix_hash, "warming"
                ), waiting
            if record is not None and is_serving(record):
                first = first or EnsureResult(
                    agent_id, box_id, state, False, prefix_hash, "warm, joining the route"
                )
                continue
            if (
                record is not None
                and record.state is WarmState.FAILED
                and now < retry_at(record, self._config.planner.retry)
            ):
                first = first or EnsureResult(
                    agent_id, box_id, state, False, prefix_hash, f"failed: {record.last_error}"
                )
                continue
            if record is not None and record.state is WarmState.WARMING:
                continue
            if not self._owns(box_id):
                first = first or EnsureResult(
                    agent_id, box_id, state, False, prefix_hash, "cold; warmed by the replica holding the box"
                )
                continue
            self._runner.charge(box_id, computed.prefix.token_count, now)
            waiter = self._runner.start_engine_work(
                box_id, live.epoch, prefix_hash, "precall", probe=False, agents=(agent_id,)
            )
            return EnsureResult(agent_id, box_id, WarmState.WARMING, False, prefix_hash, "warming"), waiter
        if first is not None:
            return first, None
        return self._cold_stand_in(agent_id, prefix_hash), None

    def _cold_stand_in(self, agent_id: str, prefix_hash: str) -> EnsureResult:
        """No box of the agent's group can take the call (all down, or the agent fits nowhere warm): name a
        healthy, warmed-up box of its model anyway, cold and not ready, rather than no box at all. The same
        box every time for one agent (rendezvous), so its calls at least warm one cache."""
        model = self._agents[agent_id].model
        live = self._health.live
        candidates = [
            box_id
            for box_id, box in self._boxes.items()
            if box.model == model
            and not self._rollout.is_draining(box_id)
            and live[box_id].healthy
            and live[box_id].warmup is WarmupStatus.DONE
        ]
        if not candidates:
            return EnsureResult(agent_id, None, None, False, prefix_hash, "no warmed-up box serves its model")
        box_id = max(candidates, key=lambda b: stable_seed("stand-in", agent_id, b))
        detail = "no warm box in its group: this box is cold for the agent"
        return EnsureResult(agent_id, box_id, WarmState.COLD, False, prefix_hash, detail)
