"""Placement that follows the fleet one edit at a time, giving exactly what a full `place` would.

Why it can be exact and cheap: in the usual case (every agent fits somewhere: the single pass, `capped`) the
answer is one pass in turn order, and an agent's choice depends only on what the boxes it looked at held
when its turn came. So the state keeps, per agent, the boxes it looked at and took (`Step`), and per box its
takers in turn order. An edit re-runs only the agents it touches — the agent edited, the agents that took a
box that left, the agents whose walk would have reached a box that joined — and then, in turn order, only
the later agents that looked at a box whose takers changed. Each agent's ranking comes from the kept
`BoxIndex`, so re-running one costs a few dict lookups. Where caps leave some agent without any box
(coverage first), the state falls back to a full placement over the kept rankings.

Size: the edits and the replay share one set of indexes (steps, takers, examiners, entered buckets); split
in two, each half would reach into the other's private state.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterable, Mapping, Sequence

from warmer.core.model import BoxSpec
from warmer.core.placement.demand import Position, Step, check_agents, incumbents_of, position
from warmer.core.placement.greedy import index_boxes, place_indexed
from warmer.core.placement.hashing import stable_seed, stable_seeds
from warmer.core.placement.ranking import BoxIndex
from warmer.core.placement.takers import BoxHistory
from warmer.core.placement.types import AgentDemand, Placement, PlacementConfig, UnplacedReason


class PlacementState:
    """The last placement of a fleet and what produced it; edits return the agents whose group changed.

    `placement()` always equals `place(boxes, agents, config, eligible=..., previous=...)` over the inputs
    as edited: boxes and agents in the order first given (a new one after the others).
    """

    def __init__(
        self,
        boxes: Sequence[BoxSpec],
        agents: Sequence[AgentDemand],
        config: PlacementConfig | None = None,
        *,
        eligible: Collection[str] | None = None,
        previous: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self._config = config or PlacementConfig()
        self._spec: dict[str, BoxSpec] = {}
        self._order: dict[str, int] = {}
        for box in boxes:
            if box.id in self._spec:
                raise ValueError(f"boxes: duplicate box id {box.id!r}")
            self._spec[box.id] = box
            self._order[box.id] = len(self._order)
        check_agents(agents)
        self._agents = {agent.agent_id: agent for agent in agents}
        self._eligible = set(eligible) if eligible is not None else None
        self._previous = {a: tuple(g) for a, g in (previous or {}).items()}
        self._seeds = dict(zip(self._agents, stable_seeds("agent", self._agents), strict=True))
        self._next_order = len(self._order)
        self._index = BoxIndex(self._config.hash_buckets)
        # Inside `update` while caps leave an agent without a box: the full placement each edit would run is
        # run once, after the last edit (one per edit cost agents x placement when every agent's volume moved)
        self._batching = False
        self._rebuild_due = False
        for box in boxes:
            if self._is_eligible(box.id):
                self._index.add(box.id, box.model, self._order[box.id])
        self._rebuild()

    # ------------------------------------------------------------------------------------------ reading

    def placement(self) -> Placement:
        return Placement(
            groups=dict(self._groups),
            wanted=dict(self._wanted),
            unplaced=dict(self._unplaced),
            dedicated=frozenset(self._dedicated),
        )

    @property
    def config(self) -> PlacementConfig:
        return self._config

    @property
    def incremental(self) -> bool:
        """Whether edits re-run only the agents they touch (False while caps leave an agent without a box:
        then every edit is a full placement over the kept rankings)."""
        return self._steps is not None

    # ------------------------------------------------------------------------------------------ editing

    def update(
        self,
        boxes: Sequence[BoxSpec],
        agents: Sequence[AgentDemand],
        *,
        eligible: Collection[str] | None = None,
        previous: Mapping[str, Sequence[str]] | None = None,
    ) -> frozenset[str]:
        """Bring the state to these inputs edit by edit (a caller that rebuilds its inputs every pass, like
        the reconciler): costs a diff over them plus the edits found. New boxes and agents count as given
        after the known ones."""
        fresh = {box.id: box for box in boxes}
        if len(fresh) != len(boxes):
            index_boxes(boxes, None, 1)  # names the duplicate
        check_agents(agents)  # bad input changes nothing
        self._batching = True
        try:
            changed = self._apply(fresh, boxes, agents, eligible, previous)
        finally:
            self._batching = False
        if self._rebuild_due:
            changed |= self._rebuild()
        return frozenset(changed)

    def _apply(
        self,
        fresh: Mapping[str, BoxSpec],
        boxes: Sequence[BoxSpec],
        agents: Sequence[AgentDemand],
        eligible: Collection[str] | None,
        previous: Mapping[str, Sequence[str]] | None,
    ) -> set[str]:
        """`update`'s edits, one after the other."""
        changed: set[str] = set()
        for box_id in [b for b in self._spec if b not in fresh]:
            changed |= self.remove_box(box_id)
        for box in boxes:
            old = self._spec.get(box.id)
            admitted = eligible is None or box.id in eligible
            if old is None:
                changed |= self.add_box(box, eligible=admitted)
                continue
            if old != box:
                changed |= self.replace_box(box)
            if self._is_eligible(box.id) != admitted:
                changed |= self.set_eligible(box.id, admitted)
        wanted = {agent.agent_id for agent in agents}
        for agent_id in [a for a in self._agents if a not in wanted]:
            changed |= self.remove_agent(agent_id)
        for agent in agents:
            changed |= self.set_agent(agent)
        if previous is not None:
            changed |= self.set_previous(previous)
        return changed

    def rebuild(self) -> frozenset[str]:
        """Place everything again over the kept rankings (what an edit falls back to while caps leave an
        agent without a box); returns the agents whose outcome changed (none: it is exact)."""
        return self._rebuild()

    def add_box(self, box: BoxSpec, *, eligible: bool = True) -> frozenset[str]:
        if box.id in self._spec:
            raise ValueError(f"boxes: duplicate box id {box.id!r}")
        if not eligible and self._eligible is None:
            self._eligible = set(self._spec)
        self._spec[box.id] = box
        self._order[box.id] = self._next_order
        self._next_order += 1
        if self._eligible is not None and eligible:
            self._eligible.add(box.id)
        return self._join(box.id) if self._is_eligible(box.id) else frozenset()

    def remove_box(self, box_id: str) -> frozenset[str]:
        if box_id not in self._spec:
            raise ValueError(f"boxes: unknown box id {box_id!r}")
        changed = self._leave(box_id) if box_id in self._index else frozenset()
        del self._spec[box_id], self._order[box_id]
        if self._eligible is not None:
            self._eligible.discard(box_id)
        return changed

    def set_eligible(self, box_id: str, eligible: bool) -> frozenset[str]:
        """Admit a box or take it out of placement (a drain) without forgetting it."""
        if box_id not in self._spec:
            raise ValueError(f"boxes: unknown box id {box_id!r}")
        if self._eligible is None:
            self._eligible = set(self._spec)
        was = box_id in self._index
        (self._eligible.add if eligible else self._eligible.discard)(box_id)
        if was == eligible:
            return frozenset()
        return self._join(box_id) if eligible else self._leave(box_id)

    def replace_box(self, box: BoxSpec) -> frozenset[str]:
        """A known box with new figures (its capacity as the engine reports it now)."""
        old = self._spec.get(box.id)
        if old is None:
            raise ValueError(f"boxes: unknown box id {box.id!r}")
        self._spec[box.id] = box
        if box.id not in self._index:
            return frozenset()
        if old.model != box.model:
            self._index.remove(box.id)
            self._index.add(box.id, box.model, self._order[box.id])
            return self._rebuild()
        return self._settle(list(self._examiners.get(box.id, ())))

    def set_agent(self, agent: AgentDemand) -> frozenset[str]:
        """Add an agent (after the others) or change one (its place in the input order stays)."""
        if self._agents.get(agent.agent_id) == agent:
            return frozenset()
        others = [a for a in self._sharing(agent.prefix_hash) if a.agent_id != agent.agent_id]
        check_agents([*others[:1], agent])
        if self._steps is not None:
            self._withdraw(agent.agent_id, dirty=True)
        self._index.forget(agent.agent_id)
        self._unshare(agent.agent_id)
        self._agents[agent.agent_id] = agent
        self._seeds.setdefault(agent.agent_id, stable_seed("agent", agent.agent_id))
        self._describe(agent)
        return self._settle([agent.agent_id], also={agent.agent_id})

    def remove_agent(self, agent_id: str) -> frozenset[str]:
        if agent_id not in self._agents:
            raise ValueError(f"agents: unknown agent id {agent_id!r}")
        if self._steps is not None:
            self._withdraw(agent_id, dirty=True)
        self._index.forget(agent_id)
        self._unshare(agent_id)
        del self._agents[agent_id], self._seeds[agent_id], self._wanted[agent_id]
        self._dedicated.discard(agent_id)
        self._groups.pop(agent_id, None)
        self._unplaced.pop(agent_id, None)
        self._pos.pop(agent_id, None)
        return self._settle((), also={agent_id})

    def set_previous(self, previous: Mapping[str, Sequence[str]]) -> frozenset[str]:
        """The boxes serving each agent now (the handover's routing): agents whose entry changed re-run."""
        fresh = {a: tuple(g) for a, g in previous.items()}
        touched = {a for a in fresh.keys() | self._previous.keys() if fresh.get(a) != self._previous.get(a)}
        for agent_id in touched:
            self._note_previous(agent_id, self._previous.get(agent_id, ()), fresh.get(agent_id, ()))
        self._previous = fresh
        return self._settle([a for a in touched if a in self._agents])

    # ---------------------------------------------------------------------------------------- internals

    def _is_eligible(self, box_id: str) -> bool:
        return self._eligible is None or box_id in self._eligible

    def _sharing(self, prefix_hash: str) -> Iterable[AgentDemand]:
        return self._by_prefix.get(prefix_hash, {}).values() if prefix_hash else ()

    def _describe(self, agent: AgentDemand) -> None:
        """Derived facts about one agent: its group size, whether it is dedicated, its turn."""
        aid = agent.agent_id
        if agent.prefix_hash:
            self._by_prefix.setdefault(agent.prefix_hash, {})[aid] = agent
        self._wanted[aid] = self._config.wanted_group_size(agent)
        (self._dedicated.add if self._config.is_dedicated(agent) else self._dedicated.discard)(aid)
        self._pos[aid] = position(agent, self._config, self._seeds[aid])

    def _unshare(self, agent_id: str) -> None:
        old = self._agents.get(agent_id)
        if old is not None and old.prefix_hash:
            sharing = self._by_prefix.get(old.prefix_hash, {})
            sharing.pop(agent_id, None)
            if not sharing:
                self._by_prefix.pop(old.prefix_hash, None)

    def _note_previous(self, agent_id: str, old: Sequence[str], new: Sequence[str]) -> None:
        for box_id in old:
            self._previous_by_box.get(box_id, set()).discard(agent_id)
        for box_id in new:
            self._previous_by_box.setdefault(box_id, set()).add(agent_id)

    def _rebuild(self) -> frozenset[str]:
        """A full placement over the kept rankings; returns the agents whose outcome changed. Within a
        batch of edits with no single pass kept, only noted as due: the batch ends with one."""
        if self._batching and self._steps is None:
            self._rebuild_due = True
            return frozenset()
        self._rebuild_due = False
        before = dict(getattr(self, "_groups", {}))
        unplaced_before = dict(getattr(self, "_unplaced", {}))
        trace: dict[str, Step] = {}
        self._pos: dict[str, Position] = {}
        placed, single = place_indexed(
            self._spec, self._index, list(self._agents.values()), self._config, self._previous,
            seeds=self._seeds, trace=trace, positions=self._pos,
        )  # fmt: skip
        self._groups: dict[str, tuple[str, ...]] = dict(placed.groups)
        self._wanted: dict[str, int] = dict(placed.wanted)
        self._unplaced: dict[str, UnplacedReason] = dict(placed.unplaced)
        self._dedicated: set[str] = set(placed.dedicated)
        self._by_prefix: dict[str, dict[str, AgentDemand]] = {}
        for agent in self._agents.values():
            if agent.prefix_hash:
                self._by_prefix.setdefault(agent.prefix_hash, {})[agent.agent_id] = agent
        self._previous_by_box: dict[str, set[str]] = {}
        for agent_id, group in self._previous.items():
            self._note_previous(agent_id, (), group)
        self._steps: dict[str, Step] | None = trace if single else None
        self._takers: dict[str, list[tuple[Position, str]]] = {}
        self._history: dict[str, BoxHistory] = {}  # from `_takers`; dropped when they change, built anew
        self._examiners: dict[str, set[str]] = {}
        self._entered: dict[tuple[str, int], set[str]] = {}
        self._pending: list[str] = []
        for agent_id, step in trace.items():  # in turn order: each box's takers come out sorted
            self._register(agent_id, step, in_order=True)
        agents, dedicated = self._agents, self._dedicated
        self._history = {b: BoxHistory(takers, agents, dedicated) for b, takers in self._takers.items()}
        return frozenset(
            a
            for a in before.keys() | self._groups.keys() | unplaced_before.keys() | self._unplaced.keys()
            if before.get(a) != self._groups.get(a) or unplaced_before.get(a) != self._unplaced.get(a)
        )

    def _register(self, agent_id: str, step: Step, *, in_order: bool = False) -> None:
        pos, model = self._pos[agent_id], self._agents[agent_id].model
        examiners, takers = self._examiners, self._takers
        for box_id in step.examined:
            seen = examiners.get(box_id)
            if seen is None:
                examiners[box_id] = {agent_id}
            else:
                seen.add(agent_id)
        for box_id in step.chosen:
            if in_order:
                takers.setdefault(box_id, []).append((pos, agent_id))
            else:
                bisect.insort(takers.setdefault(box_id, []), (pos, agent_id))
                self._history.pop(box_id, None)
        for number in step.entered:
            self._entered.setdefault((model, number), set()).add(agent_id)

    def _withdraw(self, agent_id: str, *, dirty: bool) -> list[str]:
        """Undo an agent's step and return its old group; with `dirty`, the later agents that looked at
        its boxes are queued to re-run (an edit: the agent's turn or what it holds may change)."""
        assert self._steps is not None
        step = self._steps.pop(agent_id, None)
        if step is None:
            return []
        pos, model = self._pos[agent_id], self._agents[agent_id].model
        for box_id in step.examined:
            self._examiners.get(box_id, set()).discard(agent_id)
        for box_id in step.chosen:
            takers = self._takers.get(box_id)
            if takers is not None and (pos, agent_id) in takers:
                takers.remove((pos, agent_id))
                self._history.pop(box_id, None)
        for number in step.entered:
            self._entered.get((model, number), set()).discard(agent_id)
        if dirty:
            self._pending.extend(self._later_examiners(step.chosen, pos))
        return step.chosen

    def _later_examiners(self, boxes: Iterable[str], pos: Position, skip: Collection[str] = ()) -> list[str]:
        """The agents after `pos` that looked at these boxes (whose takers changed) and would now get
        another answer there than their step took: only those can choose differently. A box that took
        one agent more at a turn refuses the agents it had taken only as far as its caps now bind, and
        most agents it had refused (on a capped fleet, many walk past it) stay refused."""
        steps, positions, agents, dedicated = self._steps, self._pos, self._agents, self._dedicated
        assert steps is not None
        cap, later = self._config.max_agents_per_box, []
        for box_id in boxes:
            history = None
            for q in self._examiners.get(box_id, ()):
                at = positions[q]
                if at <= pos or q in skip:
                    continue
                if history is None:
                    history = self._box_history(box_id)
                took = box_id in steps[q].chosen
                if history.fits(agents[q], q in dedicated, self._spec[box_id], at, cap) != took:
                    later.append(q)
        return later

    def _box_history(self, box_id: str) -> BoxHistory:
        history = self._history.get(box_id)
        if history is None:
            takers = self._takers.get(box_id, ())
            history = self._history[box_id] = BoxHistory(takers, self._agents, self._dedicated)
        return history

    def _join(self, box_id: str) -> frozenset[str]:
        """A box enters placement: the agents whose walk would have reached it, and those it served
        before, re-run."""
        box = self._spec[box_id]
        served = self._index.serves(box.model)
        number = self._index.add(box_id, box.model, self._order[box_id])
        if self._steps is None or not served:
            return self._rebuild()  # a model's first box: every agent of the model is placeable now
        dirty = [a for a in self._previous_by_box.get(box_id, ()) if a in self._agents]
        for agent_id in self._entered.get((box.model, number), ()):
            step = self._steps[agent_id]
            if (
                not step.complete
                or step.entered[-1] != number
                or self._index.ranks_before(self._seeds[agent_id], box_id, step.examined[-1])
            ):
                dirty.append(agent_id)
        return self._settle(dirty)

    def _leave(self, box_id: str) -> frozenset[str]:
        """A box leaves placement: its takers re-run; the others that only looked at it forget it."""
        model, _ = self._index.remove(box_id)
        if self._steps is None or not self._index.serves(model):
            return self._rebuild()
        takers = [agent_id for _, agent_id in self._takers.pop(box_id, [])]
        self._history.pop(box_id, None)
        for agent_id in self._examiners.pop(box_id, set()):
            step = self._steps[agent_id]
            step.examined = [b for b in step.examined if b != box_id]
        return self._settle(takers)

    def _settle(self, dirty: Iterable[str], also: Collection[str] = ()) -> frozenset[str]:
        """Re-run the dirty agents in turn order, and after each one whose boxes changed, the later agents
        that looked at those boxes. `also`: agents already known to have changed (edited ones)."""
        if self._steps is None:
            return frozenset(also) | self._rebuild()
        queue: list[tuple[Position, str]] = []
        queued: set[str] = set()
        changed = set(also)
        for agent_id in [*self._pending, *dirty]:
            if agent_id in self._agents and agent_id not in queued:
                queued.add(agent_id)
                heapq.heappush(queue, (self._pos[agent_id], agent_id))
        self._pending.clear()
        while queue:
            pos, agent_id = heapq.heappop(queue)
            old = self._withdraw(agent_id, dirty=False)
            new = self._rerun(self._agents[agent_id], pos)
            if new is None:
                return frozenset(changed | self._rebuild())  # an agent without a box: coverage first
            if new != old:
                changed.add(agent_id)
            for later in self._later_examiners(set(old) ^ set(new), pos, queued):
                if later not in queued:
                    queued.add(later)
                    heapq.heappush(queue, (self._pos[later], later))
        return frozenset(changed)

    def _rerun(self, agent: AgentDemand, pos: Position) -> list[str] | None:
        """The agent's turn of the single pass, against what the boxes held at that turn; its new group
        (None: it got no box although its model has boxes)."""
        assert self._steps is not None
        aid = agent.agent_id
        if not self._index.serves(agent.model):
            self._groups.pop(aid, None)
            self._unplaced[aid] = UnplacedReason.NO_BOXES
            return []
        step = Step()
        mine = incumbents_of(agent, self._previous, self._spec, self._index)
        walk = self._index.walk(aid, self._seeds[aid], agent.model, step.entered)
        need, dedicated = self._wanted[aid], aid in self._dedicated
        for box_id in _chain(mine, walk):
            step.examined.append(box_id)
            if self._fits_at(agent, dedicated, box_id, pos, step.chosen):
                step.chosen.append(box_id)
                if len(step.chosen) == need:
                    break
        step.complete = len(step.chosen) == need
        if not step.chosen:
            return None
        self._steps[aid] = step
        self._register(aid, step)
        self._groups[aid] = tuple(step.chosen)
        self._unplaced.pop(aid, None)
        return step.chosen

    def _fits_at(
        self, agent: AgentDemand, dedicated: bool, box_id: str, pos: Position, chosen: list[str]
    ) -> bool:
        """The single pass's check (`capped`) of the box as it was at this turn: only the takers before it
        count (`BoxHistory`, kept until the box's takers change)."""
        if box_id in chosen:
            return False
        history = self._box_history(box_id)
        return history.fits(agent, dedicated, self._spec[box_id], pos, self._config.max_agents_per_box)


def _chain(first: Sequence[str], walk: Iterable[str]) -> Iterable[str]:
    """The agent's boxes now, then its ranking without them."""
    yield from first
    if first:
        yield from (box_id for box_id in walk if box_id not in first)
    else:
        yield from walk
