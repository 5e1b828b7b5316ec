"""Desired state: which boxes keep each agent's prefix warm, and which ones its calls are routed to.

Placement (`warmer.core.placement.place`) gives each agent a group of boxes of its model, sized by the
agent's volume (campaigns widen placement ahead of their window: `warmer.core.campaigns`; pre-call asks
add their observed rate), within each box's cache capacity. It is recomputed only when its inputs
change, and then edit by edit: one `PlacementState` is kept across passes and brought to the new inputs
(a box added, removed, drained or resized, an agent's prefix or volume changed), which re-runs only the
agents the edits touch and equals a full `place` of the same inputs. Placement is sticky to where each
agent's prefix is held now, read from the shared warm records (`incumbents`), not from this replica's own
routing: several replicas then agree on it.
Handover (move-before-switch) keeps routing an agent to its old boxes until it is warm on the new ones, so a
placement change never sends calls to a cold box while a warm one exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.campaigns import campaign_demand, merge_demand
from warmer.core.errors import HealthFailure
from warmer.core.model import BoxSpec, Campaign, ModelProfile
from warmer.core.placement import (
    AgentDemand,
    Handover,
    Placement,
    PlacementConfig,
    PlacementState,
    fit_to_capacity,
    handover,
)
from warmer.core.placement.loans import LentBoxCaps
from warmer.core.planner import Desired, PrefixRef, WarmupStatus
from warmer.core.warmstate import is_serving
from warmer.service.reconciler.incumbents import SharedIncumbents
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.types import ReconcilerConfig
from warmer.service.reconciler.work_values import WorkValues


def _group_key(config: PlacementConfig, demand: AgentDemand) -> tuple[int, bool]:
    """What of an agent's volume changes its placement: the group size it wants and dedication."""
    return config.wanted_group_size(demand), config.is_dedicated(demand)


class DesiredState:
    """The latest `Desired` (`current`), the routing it carries, and the cached placement under it."""

    def __init__(
        self,
        *,
        config: ReconcilerConfig,
        boxes: Mapping[str, BoxSpec],
        profiles: Mapping[str, ModelProfile],
        agents: Mapping[str, AgentSpec],
        health: BoxHealth,
        book: WarmBook,
        drained: Callable[[str], bool],
        served: Callable[[str], bool],
        observed_demand: Callable[[], Mapping[str, float]],
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._config = config
        self._boxes = boxes
        self._profiles = profiles
        self._agents = agents
        self._health = health
        self._book = book
        self._drained = drained
        self._served = served
        self._observed_demand = observed_demand  # calls/minute per agent (pre-call asks)
        self._log = log
        self.current: Desired | None = None
        self.routing: dict[str, tuple[str, ...]] = {}
        self._placement_key: object = None
        self._placement: Mapping[str, tuple[str, ...]] = {}
        self._state: PlacementState | None = None  # built on the first placement, then edited
        self._incumbents = SharedIncumbents(config.placement.hash_buckets)
        self.volume: Mapping[str, float] = {}  # calls/minute per agent, as the last build saw it
        self.values = WorkValues()  # what engine work is worth, for the fleet pacer
        # running just-in-time loans laid over each handover (`loans.PrefixLoans.overlay`)
        self.overlay: Callable[
            [Handover, Mapping[str, str], Collection[tuple[str, str]], LentBoxCaps | None], Handover
        ] = lambda moving, _prefix_of, _warm, _caps: moving

    async def build(
        self,
        now: float,
        campaigns: Sequence[Campaign],
        refs: Mapping[str, PrefixRef],
        *,
        precall: frozenset[str],
        last_activity: Mapping[str, float],
    ) -> Desired:
        """This pass's Desired: placement, then handover from the routing of the previous pass. One turn of
        the event loop between the steps (each is milliseconds to tens of them at 1,000 agents): pre-call
        asks are answered in between. The pass holds the fleet lock across them."""
        volume = merge_demand(
            campaign_demand(campaigns, now, self._config.planner.campaign_lead_seconds),
            self._observed_demand(),
        )
        self.volume = volume
        target, placed = self._place(refs, volume)
        await asyncio.sleep(0)
        self.values.note(target, volume, {agent: ref.tokens for agent, ref in refs.items()})
        warm = {(r.box_id, r.prefix_hash) for r in self._book.trusted().values() if is_serving(r)}
        prefix_of = {agent: ref.hash for agent, ref in refs.items()}
        moving = handover(self.routing, target, prefix_of, warm, existing=self._boxes.keys())
        await asyncio.sleep(0)
        placed_boxes = {b.id: b for b in self.placement_boxes()}
        tokens_of = {agent: ref.tokens for agent, ref in refs.items()}
        moving = fit_to_capacity(moving, target, prefix_of, placed_boxes, volume, prefix_tokens=tokens_of)
        moving = self.overlay(moving, prefix_of, warm, LentBoxCaps(placed_boxes, volume, tokens_of))
        self.routing = dict(moving.routing)
        self.current = Desired(
            boxes=self._boxes,
            profiles=self._profiles,
            agents=refs,
            assignment=moving.keep_warm,
            routing=moving.routing,
            campaigns=tuple(campaigns),
            precall=precall,
            last_activity=dict(last_activity),
            placed=placed,
            calls_per_minute=volume,
        )
        return self.current

    def _eligible_boxes(self) -> frozenset[str]:
        """Boxes placement may give agents to: up, not being drained for a rollout, and not in the restart
        warm-up of a new process after having served (a restart is over in a second on some engines, far
        sooner than its warm-up). Such a box hands its agents to the rest of the fleet at once, warmed there
        before traffic moves; they come back once it is warmed up, since rendezvous ranks are fixed. Boxes
        on their first warm-up under this daemon stay eligible, so a fleet starting together is placed once,
        not reshuffled box by box as each finishes.

        A box held by another replica whose latest report is too old (`stale`) stays eligible as it was last
        seen: it is out of readiness and routes here (a late report is no ready box), but its agents are not
        moved for a late report. The holder, which polls it, moves nothing; were this replica to move them
        onto boxes it holds, it would warm them there and retire them again once the report is fresh (three
        warms per stale spell in the replica test), and before the placement followed the shared records,
        one stale spell left two replicas' placements different for good. A holder that died loses the
        lease within `lease_seconds + renew_seconds`; the box is then polled here, as it is."""
        return frozenset(
            box_id
            for box_id, live in self._health.live.items()
            if (live.healthy or (live.seen_up and live.health_error_kind is HealthFailure.STALE))
            and live.epoch is not None
            and not self._drained(box_id)
            and (live.warmup is WarmupStatus.DONE or not self._served(box_id))
        )

    def placement_boxes(self) -> list[BoxSpec]:
        """The fleet as placement sees it: configured limits, else the engine's own capacity figures."""
        capacity = self._health.capacity
        return [
            capacity[box_id].applied_to(box) if box_id in capacity else box
            for box_id, box in self._boxes.items()
        ]

    def _place(
        self, refs: Mapping[str, PrefixRef], volume: Mapping[str, float]
    ) -> tuple[Mapping[str, tuple[str, ...]], frozenset[str]]:
        """Placement is recomputed only when the fleet, a prefix or an agent's wanted group size changes
        (it is stable, but not free). `volume` (calls/minute: campaigns, pre-call asks) widens groups.
        Also returns the boxes it could place on (the eligible ones)."""
        config = self._config.placement
        demands = [
            AgentDemand(
                agent,
                self._agents[agent].model,
                ref.tokens,
                calls_per_minute=volume.get(agent, 0.0),
                prefix_hash=ref.hash,
            )
            for agent, ref in sorted(refs.items())
        ]
        boxes = self.placement_boxes()
        eligible = self._eligible_boxes()
        # where each agent is now, from the shared warm records: every replica keeps the same agents
        # sticky to the same boxes (`incumbents`), so they agree on the placement
        incumbents = self._incumbents.of(refs, self._book.records, self._health.current_epochs())
        key = (
            tuple(sorted((b.id, b.prefix_capacity, b.cache_capacity_tokens) for b in boxes)),
            tuple(sorted(eligible)),
            tuple((d.agent_id, d.prefix_hash, d.prefix_tokens, _group_key(config, d)) for d in demands),
            incumbents,
        )
        if key != self._placement_key:
            placement = self._replace(boxes, demands, eligible, incumbents)
            for agent, why in placement.unplaced.items():
                self._log.warning("agent not placed", agent=agent, reason=str(why))
            self._placement, self._placement_key = placement.groups, key
        return self._placement, eligible

    def _replace(
        self,
        boxes: Sequence[BoxSpec],
        demands: Sequence[AgentDemand],
        eligible: frozenset[str],
        incumbents: Mapping[str, tuple[str, ...]],
    ) -> Placement:
        """`place(boxes, demands, config, eligible=..., previous=incumbents)`, through the kept state: the
        first time a full placement, then only the edits since the last one."""
        config = self._config.placement
        state = self._state
        if state is None or state.config != config:
            state = PlacementState(boxes, demands, config, eligible=eligible, previous=incumbents)
        else:
            try:
                state.update(boxes, demands, eligible=eligible, previous=incumbents)
            except ValueError:
                self._state = None  # bad input: the next placement starts afresh
                raise
        self._state = state
        return state.placement()

    def routed_box_ids(self) -> set[str]:
        return {box_id for group in self.routing.values() for box_id in group}

    def forget_box(self, box_id: str) -> None:
        """A box left the fleet: out of every route and assignment at once, before the next pass."""
        self.routing = {a: tuple(b for b in group if b != box_id) for a, group in self.routing.items()}
        if self.current is not None:
            desired = self.current
            self.current = replace(
                desired,
                boxes=dict(self._boxes),
                assignment={a: tuple(b for b in g if b != box_id) for a, g in desired.assignment.items()},
                routing=dict(self.routing),
            )
