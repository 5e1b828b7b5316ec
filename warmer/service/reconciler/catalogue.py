"""The prefix catalogue: each agent's current stable prefix, computed once per spec version.

How the stable prefix itself is computed (render the chat template for a few sample tails, keep the
common token prefix) is `warmer.core.prefix`; the daemon's source is `warmer.root.reconcile`'s
`OfflinePrefixSource`. This module keeps the results: each new prefix is recorded in the store, checked
for tokenizer drift, and its agent counts as active from then on (a new agent is warmed before its first
call). A failed computation keeps the agent's previous prefix and says why (`errors`).
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.errors import WarmerError
from warmer.core.model import ModelProfile, Prefix
from warmer.core.planner import PrefixRef
from warmer.ports import StorePort
from warmer.service.reconciler.activity import AgentActivity
from warmer.service.reconciler.tokenizer_drift import TokenizerDriftCheck
from warmer.service.reconciler.types import ComputedPrefix, PrefixSource


class PrefixCatalogue:
    """Agent -> its current computed prefix, and why an agent has none."""

    def __init__(
        self,
        *,
        store: StorePort,
        source: PrefixSource,
        drift: TokenizerDriftCheck,
        activity: AgentActivity,
        log: structlog.stdlib.BoundLogger,
    ) -> None:
        self._store = store
        self._source = source
        self._drift = drift
        self._activity = activity
        self._log = log
        self.prefixes: dict[str, ComputedPrefix] = {}
        self._spec_hashes: dict[str, str] = {}  # agent -> spec hash its prefix was computed from
        # agent -> the spec object last found to have that hash: specs are frozen, so the same object needs
        # no hashing (a canonical JSON dump and a SHA-256 per agent, every pass: ~20 ms at 1,000 agents)
        self._seen_specs: dict[str, AgentSpec] = {}
        self.errors: dict[str, str] = {}

    async def refresh(
        self, agents: Mapping[str, AgentSpec], profiles: Mapping[str, ModelProfile], now: float
    ) -> None:
        """Compute the prefix of every agent whose spec changed since its last computation."""
        for agent_id, spec in agents.items():
            if self._seen_specs.get(agent_id) is spec:
                continue
            if self._spec_hashes.get(agent_id) == spec.spec_hash:
                self._seen_specs[agent_id] = spec
                continue
            profile = profiles.get(spec.model)
            if profile is None:
                self.errors[agent_id] = f"unknown model profile {spec.model!r}"
                continue
            try:
                computed = await self._source(spec, profile)
                await self._record(agent_id, spec, computed, now)
            except WarmerError as exc:
                if self.errors.get(agent_id) != str(exc):
                    self._log.error(
                        "cannot compute the agent's stable prefix", agent=agent_id, error=str(exc)
                    )
                self.errors[agent_id] = str(exc)
                continue
            self._adopt(agent_id, spec, computed, now)

    async def make_current(
        self, agent_id: str, spec: AgentSpec, computed: ComputedPrefix, now: float
    ) -> None:
        """A staged prompt's prefix (computed already) becomes the agent's current one."""
        await self._record(agent_id, spec, computed, now)
        self._adopt(agent_id, spec, computed, now)

    async def _record(self, agent_id: str, spec: AgentSpec, computed: ComputedPrefix, now: float) -> None:
        await self._store.record_prefix(
            agent_id, spec.spec_hash, computed.prefix, engine_version=computed.engine_version, at=now
        )
        await self._drift.check(agent_id, spec, computed, now)

    def _adopt(self, agent_id: str, spec: AgentSpec, computed: ComputedPrefix, now: float) -> None:
        self.prefixes[agent_id] = computed
        self._spec_hashes[agent_id] = spec.spec_hash
        self._seen_specs[agent_id] = spec
        self.errors.pop(agent_id, None)
        self._activity.first_seen(agent_id, now)

    def get(self, agent_id: str) -> ComputedPrefix | None:
        return self.prefixes.get(agent_id)

    def refs(self) -> dict[str, PrefixRef]:
        """What the planner needs of each prefix: its hash and size."""
        return {a: PrefixRef(c.prefix.hash, c.prefix.token_count) for a, c in self.prefixes.items()}

    def prefix(self, prefix_hash: str) -> Prefix | None:
        """A current prefix with this hash (warm work needs its text)."""
        for computed in self.prefixes.values():
            if computed.prefix.hash == prefix_hash:
                return computed.prefix
        return None

    def longest(self, model: str, agents: Mapping[str, AgentSpec]) -> int | None:
        """The longest current stable prefix among the agents of `model` (sizes the restart long prefill)."""
        sizes = [
            computed.prefix.token_count
            for agent_id, computed in self.prefixes.items()
            if agents[agent_id].model == model
        ]
        return max(sizes, default=None)
