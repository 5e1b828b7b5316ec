"""A box this replica does not hold, as the store shows it: what its holder's restart warm-up reached.

Only the holder polls the box's health and epoch and runs its restart warm-up and warms; the others take
its health from the holder's stored observations (`warmer.service.reconciler.health_sharing`: not ready
once they are older than the bound, polled here while no live holder is known) and learn how far the
warm-up got from the phases it wrote for that epoch, and take the warm records from the store's rows, trusting
only what the current holder verified while holding the box (`BoxOwnership.trusted_after`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from warmer.core.model import PhaseName, PhaseRecord
from warmer.core.planner import WarmupStatus


@dataclass(frozen=True, slots=True)
class StoredWarmup:
    """The restart warm-up of one (box, epoch) as its phases in the store say."""

    status: WarmupStatus
    finished_at: float | None = None
    error: str | None = None
    prefixes_open: bool = False  # PREFIXES started and not finished: the box has not been ready yet


def warmup_from_phases(phases: Sequence[PhaseRecord]) -> StoredWarmup:
    """Done once the PREFIXES phase was reached; failed while a phase failed (the holder retries); not
    started otherwise: a warm-up left part way by a holder that died is run again by the next holder."""
    failed = [p for p in phases if p.ok is False]
    if failed:
        return StoredWarmup(
            WarmupStatus.FAILED,
            finished_at=max(p.finished_at or p.started_at for p in failed),
            error=failed[-1].error,
        )
    prefixes = [p for p in phases if p.phase is PhaseName.PREFIXES]
    if prefixes:
        return StoredWarmup(
            WarmupStatus.DONE,
            finished_at=max(p.started_at for p in prefixes),
            prefixes_open=all(p.finished_at is None for p in prefixes),
        )
    return StoredWarmup(WarmupStatus.NOT_STARTED)
