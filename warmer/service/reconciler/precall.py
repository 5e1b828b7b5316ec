"""Pre-call ensure: the box a call for an agent should use, warming the agent's prefix there if needed.

An ask marks the agent as active and holds it at top priority for `precall_hold_seconds`. When the agent
has a route, the answer is immediate and wakes no pass (a pass per ask would cost CPU per call);
otherwise the warm on the agent's best box is started or joined (coalesced with the loop's own) and
awaited up to the caller's bound. Waiting asks are answered when any engine work finishes, not at the end
of the next pass: a box of the agent's group where its prefix was just verified warm is a route at once
(the next pass's handover joins it to the routing for the same reason). An agent placement left
without a group (a crowded fleet's tail) borrows room just in time: the least valuable prefix of one box
of its model gives it up (`loans`), and the ask waits for the borrower's warm like any other. Only when
no room can be lent is a cold stand-in of its model named, rather than no box at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from warmer.core.agents import AgentSpec
from warmer.core.model import BoxSpec, WarmState
from warmer.core.placement import Handover, stable_seed
from warmer.core.planner import WarmupStatus
from warmer.core.readiness import Route
from warmer.core.warmstate import is_serving, retry_at
from warmer.ports import Clock
from warmer.service.reconciler.actions import ActionRunner
from warmer.service.reconciler.activity import AgentActivity
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.desired import DesiredState
from warmer.service.reconciler.fleet_edits import Rollout
from warmer.service.reconciler.loans import PrefixLoans
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.types import EnsureResult, ReconcilerConfig, UnknownAgent

# From a pre-call answer to its call's first turn reaching the engine: a prefix answered this recently never
# leaves its box, even for the room of a call that would otherwise land cold (`PrecallWarming._lend`).
FIRST_TURN_SECONDS = 2.0


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
        lent_routes_for: Callable[[str, tuple[str, ...]], tuple[Route, ...]],
        loans: PrefixLoans,
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
        self._lent_routes_for = lent_routes_for  # (agent, boxes lent to it) -> its routes there
        self._loans = loans
        self._answered: dict[str, float] = {}  # agent -> when an ask of it was last answered with a box
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
            result, waiter, homeless = self._step(agent_id)
            if result.routed:
                return self._note(
                    result
                )  # warm: nothing for the loop to do, so no pass (a pass per ask is CPU per call)
            if homeless and await self._lend(agent_id):
                continue  # room was lent: the next look starts (or joins) the warm there
            if not woken:
                self._poke()
                woken = True
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return self._note(result)
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
                return self._note(self._step(agent_id)[0])

    def _step(self, agent_id: str) -> tuple[EnsureResult, asyncio.Future[Any] | None, bool]:
        """One look at the agent: (answer now, what to wait for next (None = the next change), whether
        no box of its group can take the call: room may then be lent)."""
        computed = self._catalogue.get(agent_id)
        desired = self._desired.current
        if computed is None or desired is None:
            detail = self._catalogue.errors.get(agent_id, "prefix not computed yet")
            return EnsureResult(agent_id, None, None, False, None, detail), None, False
        prefix_hash = computed.prefix.hash
        now = self._clock.now()
        lent = self._loans.boxes_of(agent_id)
        found = (
            self._routes_for(agent_id)
            or self._joining_routes_for(agent_id)
            or (self._lent_routes_for(agent_id, lent) if lent else ())
        )
        if found:
            safe = tuple(route for route in found if not self._at_risk(route.box_id, prefix_hash, now))
            if safe:
                answer = EnsureResult(
                    agent_id, safe[0].box_id, WarmState.WARM, True, prefix_hash, "warm", safe
                )
                return answer, None, False
            answer, probing = self._verify(agent_id, found[0].box_id, prefix_hash)
            return answer, probing, False
        first: EnsureResult | None = None
        group = [b for b in desired.assignment.get(agent_id, ()) if not self._loans.lent_away(b, agent_id)]
        for box_id in dict.fromkeys([*group, *lent]):
            live = self._health.live[box_id]
            if not live.healthy or live.epoch is None or live.warmup is not WarmupStatus.DONE:
                continue
            key = (box_id, live.epoch, prefix_hash)
            record = self._book.get(key)
            state = record.state if record is not None else WarmState.COLD
            waiting = self._runner.in_flight.get((box_id, prefix_hash))
            if waiting is not None:
                return (
                    EnsureResult(
                        agent_id,
                        box_id,
                        WarmState.WARMING,
                        False,
                        prefix_hash,
                        "warming",
                        slot=self._book.slot(key),
                    ),
                    waiting,
                    False,
                )
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
            reason = "precall, room lent" if box_id in lent else "precall"
            waiter = self._runner.start_engine_work(
                box_id, live.epoch, prefix_hash, reason, probe=False, agents=(agent_id,), urgent=True
            )
            answer = EnsureResult(
                agent_id, box_id, WarmState.WARMING, False, prefix_hash, "warming", slot=self._book.slot(key)
            )
            return answer, waiter, False
        if first is not None:
            return first, None, False
        return self._cold_stand_in(agent_id, prefix_hash), None, True

    def _at_risk(self, box_id: str, prefix_hash: str, now: float) -> bool:
        """The prefix's slot on the box was given to another prefix's call that may still be sending turns
        there (`WarmBook.at_risk`): its record alone cannot vouch for it. Boxes held elsewhere are left to
        their holder."""
        epoch = self._health.live[box_id].epoch
        if epoch is None or not self._owns(box_id):
            return False
        return self._book.at_risk((box_id, epoch, prefix_hash), now, self._config.precall_call_hold_seconds)

    def _verify(
        self, agent_id: str, box_id: str, prefix_hash: str
    ) -> tuple[EnsureResult, asyncio.Future[Any]]:
        """Probe the prefix in its contested slot (coalesced with any warm or probe in flight); the ask
        waits for it like for a warm, and a cold reading takes the box out of the agent's routes."""
        epoch = self._health.live[box_id].epoch
        assert epoch is not None
        probing = self._runner.start_engine_work(
            box_id,
            epoch,
            prefix_hash,
            "probe: slot shared with a running call",
            probe=True,
            agents=(agent_id,),
            urgent=True,
        )
        slot = self._book.slot((box_id, epoch, prefix_hash))
        detail = "verifying: its slot served another call"
        answer = EnsureResult(agent_id, box_id, WarmState.WARMING, False, prefix_hash, detail, slot=slot)
        return answer, probing

    def _note(self, result: EnsureResult) -> EnsureResult:
        """An answer that sends a call to a box where the prefix is (or is being) warmed: its first turn
        is on its way, so the prefix stays there for the protection window."""
        if result.routed or result.state is WarmState.WARMING:
            self._answered[result.agent_id] = self._clock.now()
        return result

    def answered_within(self, seconds: float) -> frozenset[str]:
        """Agents answered ready this recently: their calls' first turns may not have reached the box.
        Answers older than the protection window (the longest asked for) are forgotten."""
        now = self._clock.now()
        keep = max(seconds, self._loans.protect_seconds)
        self._answered = {agent: at for agent, at in self._answered.items() if now - at <= keep}
        return frozenset(agent for agent, at in self._answered.items() if now - at <= seconds)

    async def _lend(self, agent_id: str) -> bool:
        """Room for an agent no box of whose group can take its call, on the box of its model where the
        prefixes that leave for it save the least prefill (`warmer.core.placement.loans`)."""
        desired = self._desired.current
        computed = self._catalogue.get(agent_id)
        if not self._loans.enabled or desired is None or computed is None:
            return False
        model = self._agents[agent_id].model
        live = self._health.live
        candidates = [
            box
            for box in self._desired.placement_boxes()
            if box.model == model
            and self._owns(box.id)
            and not self._rollout.is_draining(box.id)
            and live[box.id].healthy
            and live[box.id].epoch is not None
            and live[box.id].warmup is WarmupStatus.DONE
        ]
        if not candidates:
            return False
        refs = desired.agents
        prefix_of = {agent: ref.hash for agent, ref in refs.items()}
        moving = self._loans.overlay(
            Handover(routing=desired.routing or {}, keep_warm=desired.assignment, pending={}), prefix_of, ()
        )
        held: dict[str, list[str]] = {}
        for agent, group in moving.keep_warm.items():
            for box_id in group:
                held.setdefault(box_id, []).append(agent)
        # ...and whatever holds a slot there now (a warm the last pass had not placed yet): room that
        # looks free but is not would let the engine evict a prefix still vouched for
        agent_of = {ref.hash: agent for agent, ref in refs.items()}
        for box_id, epoch, prefix_hash in self._book.pins:
            pinned = agent_of.get(prefix_hash)
            if pinned is not None and live[box_id].epoch == epoch and pinned not in held.get(box_id, []):
                held.setdefault(box_id, []).append(pinned)
        lent = None
        # Within the protection window no answered prefix leaves; when that leaves nowhere, the call would
        # land cold in a slot the engine picks (evicting a prefix still vouched for): better to lend the
        # room of one answered longer ago than its first turn takes, chosen and released first.
        for protect in dict.fromkeys(
            (self._loans.protect_seconds, min(FIRST_TURN_SECONDS, self._loans.protect_seconds))
        ):
            lent = await self._loans.lend(
                agent_id,
                tokens=computed.prefix.token_count,
                candidates=candidates,
                epochs={box.id: live[box.id].epoch or "" for box in candidates},
                held=held,
                tokens_of={agent: ref.tokens for agent, ref in refs.items()},
                prefix_of=prefix_of,
                volume=self._desired.volume,
                capacity=self._health.capacity,
                busy=lambda box_id, prefix_hash: (box_id, prefix_hash) in self._runner.in_flight,
                answered=self.answered_within(protect),
            )
            if lent is not None:
                break
        if lent is None:
            return False
        await self._touch_keepers(lent, held.get(lent, ()), agent_id, prefix_of)
        return True

    async def _touch_keepers(
        self, box_id: str, held: Sequence[str], borrower: str, prefix_of: Mapping[str, str]
    ) -> None:
        """On a box whose requests cannot name a slot, the engine evicts least recently used first: the
        prefixes that stay are touched (a probe each, a cached prefill) before the borrower's warm, so
        the one evicted is the victim that already left the routes, not a prefix still vouched for."""
        capacity = self._health.capacity.get(box_id)
        if capacity is not None and capacity.pinnable_slots:
            return  # the borrower's warm runs in the victim's own slot
        epoch = self._health.live[box_id].epoch
        if epoch is None:
            return
        waiters = []
        for agent in held:
            prefix_hash = prefix_of.get(agent)
            if agent == borrower or prefix_hash is None or self._loans.lent_away(box_id, agent):
                continue
            record = self._book.get((box_id, epoch, prefix_hash))
            if record is not None and is_serving(record):
                waiters.append(
                    self._runner.start_engine_work(
                        box_id,
                        epoch,
                        prefix_hash,
                        "touch before a lent warm",
                        probe=True,
                        agents=(agent,),
                        urgent=True,
                    )
                )
        if waiters:
            await asyncio.gather(*waiters)

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
