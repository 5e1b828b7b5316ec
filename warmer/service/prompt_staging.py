"""Staged prompts: a new prompt spec for an agent, warmed beside the current one before routes switch.

Kept out of the reconciler's loop because it is a small state machine of its own (staged -> prefix
computed -> current, or rejected), and the loop only needs three things from it: the plan's view with the
staged prefixes wanted, a prefix lookup for warm work, and a pass that computes staged prefixes. Deciding
*when* a staged prompt becomes current, and making it current, needs the reconciler's routes and prefix
state, so the reconciler keeps that and is called back per staged prompt (`settle`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import WarmerError
from warmer.core.model import LoggedEvent, ModelProfile, Prefix
from warmer.core.planner import Desired, PrefixRef
from warmer.ports import StorePort
from warmer.service.reconcile_types import PendingPrompt, PrefixSource

PENDING_AGENT_SUFFIX = "#pending"  # planner-only key for a staged prompt's prefix (never in routes)
EVENT_PROMPT_STAGED = "prompt_staged"
EVENT_PROMPT_REJECTED = "prompt_rejected"


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
                            kind=EVENT_PROMPT_REJECTED,
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
                        kind=EVENT_PROMPT_STAGED,
                        agent_id=agent_id,
                        prefix_hash=computed.prefix.hash,
                        detail={"spec_hash": spec.spec_hash, "tokens": computed.prefix.token_count},
                    )
                )
            await settle(agent_id, pending, now)
