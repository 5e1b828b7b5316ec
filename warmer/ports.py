"""Ports: the Protocols services depend on. Adapters implement them; unit tests fake them here."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from warmer.core.kv_event_stream import EventBatch
from warmer.core.leases import LeaseConfig, LeaseView
from warmer.core.model import (
    BoxCapacity,
    BoxSpec,
    CacheLayout,
    CacheStats,
    Campaign,
    CompletionReport,
    LoggedEvent,
    PhaseRecord,
    Prefix,
    WarmRecord,
    WarmState,
)
from warmer.core.observations import HealthObservation, StoredObservation
from warmer.core.shared_state import SharedFleetState, StateChange
from warmer.core.tokenizer_drift import TokenCountObservation


class Clock(Protocol):
    """Time as the daemon sees it; a fake one makes keepalive and campaigns testable without sleeping."""

    def now(self) -> float:
        """Unix seconds."""
        ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class EnginePort(Protocol):
    """One engine box, spoken to in its own dialect. Every call has a timeout and a typed failure."""

    async def health(self, box: BoxSpec) -> bool:
        """True when the engine answers its health endpoint as ready to serve."""
        ...

    async def epoch(self, box: BoxSpec) -> str:
        """Identity of the running engine process; changes when it restarts."""
        ...

    async def complete_prefix(
        self,
        box: BoxSpec,
        prefix: Prefix,
        *,
        suffix: str = "",
        max_tokens: int = 1,
        slot: int | None = None,
        rank: int | None = None,
    ) -> CompletionReport:
        """Send the prefix (plus an optional short suffix) greedily; report cached prompt tokens.

        `slot`: run it in that engine slot, where the engine has pinnable slots (`BoxCapacity`); ignored
        elsewhere. `rank`: pin a data-parallel rank (`CacheLayout.data_parallel_ranks` > 1); engines
        without ranks refuse it with NotSupported."""
        ...

    async def complete_prompt(
        self,
        box: BoxSpec,
        prompt: str,
        *,
        max_tokens: int,
        temperature: float = 0.0,
        json_schema: dict[str, object] | None = None,
    ) -> CompletionReport:
        """A plain request, used by the restart warm-up (sampled, constrained, bursts, long prefill)."""
        ...

    async def render_chat(
        self, box: BoxSpec, messages: Sequence[dict[str, object]], tools: Sequence[dict[str, object]]
    ) -> str:
        """The prompt text the engine builds from chat messages (+ tools, generation prompt)."""
        ...

    async def tokenize(self, box: BoxSpec, text: str) -> list[int]:
        """The engine's own token ids for `text`, as a completion request of that text would see them."""
        ...

    async def cache_stats(self, box: BoxSpec) -> CacheStats:
        """The engine's cumulative prefix-cache counters."""
        ...

    async def cache_layout(self, box: BoxSpec) -> CacheLayout:
        """How the running server counts a hit (page/block size, hybrid state strategy); fields it does not
        report are None, so the caller falls back to the model profile."""
        ...

    async def capacity(self, box: BoxSpec) -> BoxCapacity:
        """How many prefixes the box's cache holds beside its live calls (unknown fields are None)."""
        ...


class StorePort(Protocol):
    """Durable warm state. Every write is atomic; history is append-only."""

    async def sync_boxes(self, boxes: Sequence[BoxSpec]) -> None: ...

    async def record_epoch(self, box_id: str, epoch: str, at: float) -> bool:
        """Remember the box's current epoch; True when it differs from the last one recorded."""
        ...

    async def record_epochs(
        self, seen: Sequence[tuple[str, str, float]], *, drop_others: bool = False
    ) -> frozenset[str]:
        """`record_epoch` for many (box id, epoch, when) in one transaction; returns the boxes skipped
        because another replica holds their lease. `drop_others`: the epochs are new processes, so each
        written box's warm records of its other epochs go as `drop_other_epochs` drops them."""
        ...

    async def current_epoch(self, box_id: str) -> str | None: ...

    async def record_prefix(
        self, agent_id: str, spec_hash: str, prefix: Prefix, *, engine_version: str, at: float
    ) -> None: ...

    async def prefix_token_history(self, model: str, text_hash: str) -> list[TokenCountObservation]:
        """Recorded token counts of one prefix TEXT (`prefix_hash(text)`, no ids) for one model, oldest
        first: what tokenizer drift is judged against."""
        ...

    async def get_warm(self, box_id: str, epoch: str, prefix_hash: str) -> WarmRecord | None: ...

    async def list_warm(self, *, box_id: str | None = None, epoch: str | None = None) -> list[WarmRecord]: ...

    async def put_warm(self, record: WarmRecord, *, reason: str, previous: WarmState | None) -> None:
        """Write the record and append a transition event, in one transaction."""
        ...

    async def put_phase(self, record: PhaseRecord) -> None: ...

    async def put_phases_and_events(
        self, phases: Sequence[PhaseRecord], events: Sequence[LoggedEvent]
    ) -> frozenset[str]:
        """Phases and events of many boxes in one transaction; returns the boxes whose phases were skipped
        because another replica holds their lease."""
        ...

    async def list_phases(self, box_id: str, epoch: str) -> list[PhaseRecord]: ...

    async def phases_of(self, epochs: Mapping[str, str]) -> dict[str, list[PhaseRecord]]:
        """`list_phases` of each box's given epoch (box id -> epoch) in one read; every box asked is a
        key (an empty list when it has none)."""
        ...

    async def put_campaign(self, campaign: Campaign) -> None: ...

    async def delete_campaign(self, campaign_id: str) -> bool: ...

    async def list_campaigns(self) -> list[Campaign]: ...

    async def remember_webhook(self, event_id: str, kind: str, body_sha256: str, at: float) -> bool:
        """Record a received webhook; False when that event id was already seen (idempotency)."""
        ...

    async def append_event(self, event: LoggedEvent) -> None: ...

    async def events(self, *, box_id: str | None = None, limit: int = 100) -> list[LoggedEvent]: ...

    async def drop_other_epochs(self, box_id: str, keep_epoch: str) -> int:
        """Delete the box's warm records of every epoch but `keep_epoch` (they died with their
        process); epochs, phases and the event log keep the history. Returns how many went."""
        ...

    async def ping(self) -> None:
        """Round-trip to the database (for /readyz); raises StoreUnavailable when it does not answer."""
        ...


class CoordinationPort(Protocol):
    """What several replicas on one database share beyond warm state: box leases (who sends each box its
    engine work, `warmer.core.leases`) and the deploy state every replica applies
    (`warmer.core.shared_state`)."""

    @property
    def notifies(self) -> bool:
        """True when a write here wakes the other replicas at once (else they see it on their next pass)."""
        ...

    async def heartbeat(
        self,
        replica_id: str,
        boxes: Sequence[str],
        *,
        at: float,
        config: LeaseConfig,
        detail: Mapping[str, object] | None = None,
        busy: Collection[str] = (),
    ) -> LeaseView:
        """Renew the replica and the leases it keeps, release its excess (never a box it is `busy` with),
        take free boxes up to its fair share, in one transaction; the leases and live replicas as it left
        them."""
        ...

    async def release(self, replica_id: str, *, leave: bool = True) -> None:
        """Give back every lease of the replica now (and, with `leave`, its membership)."""
        ...

    async def lease_view(self) -> LeaseView: ...

    async def phases_for(self, epochs: Mapping[str, str]) -> dict[str, list[PhaseRecord]]:
        """Restart warm-up phases of each box's given epoch (box id -> epoch), in one read."""
        ...

    async def shared_state(self) -> SharedFleetState: ...

    async def apply_deploy(
        self, event_id: str, kind: str, body_sha256: str, at: float, change: StateChange
    ) -> bool:
        """Remember a webhook event id and write its change atomically; False when the id was seen."""
        ...


class HealthExchangePort(Protocol):
    """Box health as lease holders saw it, shared through the store (`warmer.core.observations`)."""

    async def publish(
        self, replica_id: str, changed: Mapping[str, HealthObservation], *, stamp: bool
    ) -> frozenset[str]:
        """Write the changed observations of boxes the replica holds and, with `stamp`, mark its poll round
        over every box it holds, in one transaction; the boxes written."""
        ...

    async def read(self, box_ids: Collection[str]) -> dict[str, StoredObservation]:
        """Each box's stored observation, aged by the database's clock, with whether its observer holds it."""
        ...


class GatewayPort(Protocol):
    """A router in front of the boxes (e.g. SGLang Model Gateway): workers in, workers out."""

    async def register(self, box: BoxSpec) -> None: ...

    async def deregister(self, box: BoxSpec) -> None: ...

    async def registered(self) -> set[str]:
        """Base URLs the gateway lists as workers (usable or not)."""
        ...

    async def listing(self) -> dict[str, bool]:
        """Each listed base URL and whether the gateway can route to it (listed is not routed: a worker
        whose health checks fail, or smg's Failed, stays listed)."""
        ...


class CacheEventStream(Protocol):
    """One box's KV cache events, in the order the engine published them (vLLM `--kv-events-config`)."""

    async def receive(self) -> EventBatch:
        """The next published batch (waits for it); MalformedResponse when it cannot be read."""
        ...

    async def replay(self, start_seq: int) -> list[EventBatch]:
        """The batches the publisher still buffers from `start_seq` on, oldest first (it may have dropped
        the first ones); NotSupported when the box has no replay socket."""
        ...

    async def aclose(self) -> None: ...


class CacheEventPort(Protocol):
    """Opens a box's event stream (`BoxSpec.kv_events`)."""

    def subscribe(self, box: BoxSpec, rank: int = 0) -> CacheEventStream:
        """The box's stream; `rank`: a data-parallel rank's own stream (published on its own port)."""
        ...
