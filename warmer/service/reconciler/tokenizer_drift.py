"""Raising tokenizer drift when an agent's prefix is (re)computed.

The pure comparison is `warmer.core.lint`; this is the part that reads the store's token-count history,
logs, writes the event and counts it.
"""

from __future__ import annotations

import structlog

from warmer.core.agents import AgentSpec
from warmer.core.event_kinds import EventKind
from warmer.core.model import LoggedEvent, prefix_hash
from warmer.core.tokenizer_drift import TokenCountObservation, detect_tokenizer_drift, drift_baseline
from warmer.ports import StorePort
from warmer.service.reconciler.types import ComputedPrefix, ReconcileObserver


class TokenizerDriftCheck:
    """Compares a just-recorded prefix's token count with the one under the previous engine version."""

    def __init__(
        self,
        *,
        store: StorePort,
        observer: ReconcileObserver,
        log: structlog.stdlib.BoundLogger,
        threshold: float,
    ) -> None:
        self._store = store
        self._observer = observer
        self._log = log
        self._threshold = threshold

    async def check(self, agent_id: str, spec: AgentSpec, computed: ComputedPrefix, now: float) -> None:
        """Compare the just-recorded token count of the agent's prefix text with the one recorded under
        the previous engine version; a material change is logged, appended to the event log and counted.

        Runs whenever a prefix is (re)computed: once per spec version per daemon process, so a drift that
        is still there after a daemon restart is raised again (and its gauge restored)."""
        prefix = computed.prefix
        model = prefix.model or spec.model
        current = TokenCountObservation(
            prefix_hash(prefix.text), model, computed.engine_version, prefix.token_count, now
        )
        history = await self._store.prefix_token_history(model, current.text_hash)
        threshold = self._threshold
        finding = detect_tokenizer_drift(history, current, threshold=threshold)
        previous = drift_baseline(history, current)
        if finding is None or previous is None:
            return
        change = (current.token_count - previous.token_count) / previous.token_count
        detail: dict[str, object] = {
            "model": model,
            "text_hash": current.text_hash,
            "engine_version_before": previous.engine_version,
            "engine_version_after": current.engine_version,
            "tokens_before": previous.token_count,
            "tokens_after": current.token_count,
            "change": round(change, 6),
            "message": finding.message,
        }
        self._log.warning(
            EventKind.TOKENIZER_DRIFT,
            agent=agent_id,
            prefix=prefix.hash,
            change_pct=round(change * 100, 2),
            **{k: v for k, v in detail.items() if k not in ("change", "message")},
        )
        await self._store.append_event(
            LoggedEvent(
                at=now,
                kind=EventKind.TOKENIZER_DRIFT,
                agent_id=agent_id,
                prefix_hash=prefix.hash,
                detail=detail,
            )
        )
        self._observer.tokenizer_drift(agent_id, model, change)
