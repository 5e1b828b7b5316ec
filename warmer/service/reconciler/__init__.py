"""The reconciler: keeps the engines' caches holding what should be warm (`Reconciler`, in `loop`).

One module per concern: `loop` (observe -> desired -> diff -> act), `restart_detection` (health and
epochs: how a restart is detected), `catalogue` (agents' stable prefixes), `records` (the warm-state
view), `desired` (placement and handover), `actions` (the action runner), `ready_reports` (when a box
became ready), `fleet_edits` (boxes added/removed, rollout drains), `prompts` (staged prompts and their
promotion), `precall` (pre-call ensure), `activity` (agent traffic and pre-call holds), `parts` (how they
are wired), `types` (the vocabulary other modules import).
"""

from warmer.service.reconciler.loop import Reconciler
from warmer.service.reconciler.types import (
    BoxLive,
    ComputedPrefix,
    EnsureResult,
    NullObserver,
    PendingPrompt,
    PrefixSource,
    ReadyReport,
    ReconcileObserver,
    ReconcilerConfig,
    Snapshot,
    UnknownAgent,
)

__all__ = [
    "BoxLive",
    "ComputedPrefix",
    "EnsureResult",
    "NullObserver",
    "PendingPrompt",
    "PrefixSource",
    "ReadyReport",
    "ReconcileObserver",
    "Reconciler",
    "ReconcilerConfig",
    "Snapshot",
    "UnknownAgent",
]
