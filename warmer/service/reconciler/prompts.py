"""Prompt changes: a new prompt spec for an agent is staged, warmed beside the current one, then promoted.

`PromptStaging` is the small state machine of staged prompts (staged -> prefix computed -> current, or
rejected): it gives the plan's view with the staged prefixes wanted and the prefix text warm work needs.
`PromptPromotion` decides *when* a staged prompt becomes current (warm on every box the agent is routed
to, or a reason it cannot wait) and makes it current, so a prompt change never leaves the agent without
a warm route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import ConfigError, WarmerError
from warmer.core.event_kinds import EventKind
from warmer.core.model import LoggedEvent, ModelProfile, Prefix
from warmer.core.planner import Desired, PrefixRef
from warmer.core.readiness import Route
from warmer.core.warmstate import is_serving
from warmer.ports import Clock, StorePort
from warmer.service.reconciler.catalogue import PrefixCatalogue
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.types import (
    BoxLive,
    PendingPrompt,
    PrefixSource,
    ReconcilerConfig,
    UnknownAgent,
)

PENDING_AGENT_SUFFIX = "#pending"  # planner-only key for a staged prompt's prefix (never in routes)


class PromptStaging:
    """The staged prompt per agent (a newer staged spec replaces an older one) and their prefixes."""

    def __init__(
        self, *, store: StorePort, prefix_source: PrefixSource, log: structlog.stdlib.BoundLogger
    ) -> None:
        self._store = store
        self._prefix_source = prefix_source
        self._log = log
        self._pending: dict[str, PendingPrompt] = {}

    def pending(self) -> dict[str, PendingPrompt]:
        return dict(self._pending)

    def stage(self, spec: AgentSpec, now: float) -> None:
        """Stage `spec` (already validated by the caller); its prefix is computed on the next pass."""
        self._pending[spec.id] = PendingPrompt(spec, now)

    def discard(self, agent_id: str, pending: PendingPrompt) -> None:
        """Forget `pending` unless a newer spec was staged for the agent meanwhile."""
        if self._pending.get(agent_id) is pending:
            del self._pending[agent_id]

    def prefix(self, prefix_hash: str) -> Prefix | None:
        """A staged prompt's computed prefix with this hash (warm work needs its text)."""
        for pending in self._pending.values():
            if pending.computed is not None and pending.computed.prefix.hash == prefix_hash:
                return pending.computed.prefix
        return None

    def with_pending(self, desired: Desired, now: float) -> Desired:
        """The plan's view: each staged prompt's prefix wanted on the agent's boxes, under a planner-only
        key, so routes and readiness (built from `desired` itself) never see it."""
        if not self._pending:
            return desired
        agents, assignment = dict(desired.agents), dict(desired.assignment)
        activity = dict(desired.last_activity)
        for agent_id, pending in self._pending.items():
            if pending.computed is None:
                continue
            key = agent_id + PENDING_AGENT_SUFFIX
            agents[key] = PrefixRef(pending.computed.prefix.hash, pending.computed.prefix.token_count)
            assignment[key] = desired.assignment.get(agent_id, ())
            activity[key] = now
        return replace(desired, agents=agents, assignment=assignment, last_activity=activity)

    async def refresh(
        self,
        now: float,
        *,
        agents: Mapping[str, AgentSpec],
        profiles: Mapping[str, ModelProfile],
        settle: Callable[[str, PendingPrompt, float], Awaitable[None]],
    ) -> None:
        """Compute staged prompts' prefixes (dropping those of agents no longer defined), then hand each
        computed one to `settle`, which makes it current once it is warm where the agent is routed."""
        for agent_id, pending in list(self._pending.items()):
            if agent_id not in agents:
                self._pending.pop(agent_id, None)
                continue
            if pending.computed is None:
                spec = pending.spec
                try:
                    computed = await self._prefix_source(spec, profiles[spec.model])
                except WarmerError as exc:
                    if self._pending.get(agent_id) is pending:
                        del self._pending[agent_id]
                    self._log.error("staged prompt rejected: the old one stays current", agent=agent_id,
                                    error=str(exc))  # fmt: skip
                    await self._store.append_event(
                        LoggedEvent(
                            at=now,
                            kind=EventKind.PROMPT_REJECTED,
                            agent_id=agent_id,
                            detail={"spec_hash": spec.spec_hash, "error": str(exc)},
                        )
                    )
                    continue
                if self._pending.get(agent_id) is not pending:
                    continue  # replaced by a newer spec meanwhile
                pending = self._pending[agent_id] = replace(pending, computed=computed)
                await self._store.append_event(
                    LoggedEvent(
                        at=now,
                        kind=EventKind.PROMPT_STAGED,
                        agent_id=agent_id,
                        prefix_hash=computed.prefix.hash,
                        detail={"spec_hash": spec.spec_hash, "tokens": computed.prefix.token_count},
                    )
                )
            await settle(agent_id, pending, now)


class PromptPromotion:
    """Stages prompt specs and makes each current once `done` says why it may."""

    def __init__(
        self,
        *,
        store: StorePort,
        clock: Clock,
        config: ReconcilerConfig,
        agents: dict[str, AgentSpec],
        profiles: Mapping[str, ModelProfile],
        staging: PromptStaging,
        catalogue: PrefixCatalogue,
        book: WarmBook,
        live: Callable[[str], BoxLive | None],
        routes_now: Callable[[float], Mapping[str, tuple[Route, ...]] | None],
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._store = store
        self._clock = clock
        self._config = config
        self._agents = agents
        self._profiles = profiles
        self._staging = staging
        self._catalogue = catalogue
        self._book = book
        self._live = live
        self._routes_now = routes_now
        self._log = log

    def stage(self, spec: AgentSpec) -> None:
        """Warm `spec`'s prefix beside the current one; it becomes current once warm where the agent is
        routed (or at once when the agent has no warm route). A newer staged spec replaces an older one."""
        if spec.id not in self._agents:
            raise UnknownAgent(spec.id)
        if spec.model not in self._profiles:
            raise ConfigError([("spec.model", f"unknown model profile {spec.model!r}")])
        self._staging.stage(spec, self._clock.now())

    async def refresh(self, now: float) -> None:
        """Compute staged prefixes and promote those that may become current."""
        await self._staging.refresh(now, agents=self._agents, profiles=self._profiles, settle=self._settle)

    async def _settle(self, agent_id: str, pending: PendingPrompt, now: float) -> None:
        why = self.done(agent_id, pending, now)
        if why is not None:
            await self._promote(agent_id, pending, why, now)

    def done(self, agent_id: str, pending: PendingPrompt, now: float) -> str | None:
        """Why the staged prompt may become current now, or None to keep warming it."""
        computed = pending.computed
        if computed is None:
            return None
        current = self._catalogue.get(agent_id)
        if current is None:
            return "the agent had no current prefix"
        if current.prefix.hash == computed.prefix.hash:
            return "same stable prefix"
        if pending.spec.model != self._agents[agent_id].model:
            return "model changed: the agent's old boxes cannot serve it"
        if now - pending.staged_at >= self._config.pending_prompt_timeout_seconds:
            return "timed out: made current without being warm on every routed box"
        serving = self._routes_now(now)
        if serving is None:
            return None
        routed = serving.get(agent_id, ())
        if not routed:
            return "the agent had no warm route"
        trusted = self._book.trusted()
        for route in routed:
            live = self._live(route.box_id)
            record = trusted.get((route.box_id, live.epoch or "", computed.prefix.hash)) if live else None
            if record is None or not is_serving(record) or record.warmed_at is None:
                return None
        return "verified warm on every routed box"

    async def _promote(self, agent_id: str, pending: PendingPrompt, why: str, now: float) -> None:
        computed = pending.computed
        assert computed is not None
        spec = pending.spec
        old = self._catalogue.get(agent_id)
        await self._catalogue.make_current(agent_id, spec, computed, now)
        self._agents[agent_id] = spec
        self._staging.discard(agent_id, pending)
        self._log.info("staged prompt is current", agent=agent_id, prefix=computed.prefix.hash, reason=why)
        await self._store.append_event(
            LoggedEvent(
                at=now,
                kind=EventKind.PROMPT_CURRENT,
                agent_id=agent_id,
                prefix_hash=computed.prefix.hash,
                detail={
                    "spec_hash": spec.spec_hash,
                    "previous_prefix": old.prefix.hash if old is not None else None,
                    "reason": why,
                },
            )
        )
