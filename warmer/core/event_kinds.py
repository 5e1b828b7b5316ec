"""Every kind of row in the event log (`LoggedEvent.kind`), in one place.

The values are what the `events` table stores and what operators query, so they stay readable and never
change for a kind that exists: renaming one would split a kind's history in two. A fact is written under
one kind only: a box joining or leaving the fleet is `box_added`/`box_removed`, written by the store when
the box's row is created or deleted, whatever added it (config, a deploy event, discovery); the deploy
event itself is the `deploy_event` row. Rows written by earlier versions may also hold `fleet_box_added`
and `fleet_box_removed` (a deploy event's copy of those two facts, no longer written).
"""

from __future__ import annotations

from enum import StrEnum


class EventKind(StrEnum):
    # the fleet
    BOX_ADDED = "box_added"
    BOX_REMOVED = "box_removed"
    BOX_DRAINED = "box_drained"  # a rollout took it out of placement
    BOX_UNDRAINED = "box_undrained"
    # health and restarts
    BOX_HEALTHY = "box_healthy"
    BOX_UNHEALTHY = "box_unhealthy"
    EPOCH_CHANGED = "epoch_changed"
    RESTART_WARMUP = "restart_warmup"
    BOX_READY = "box_ready"
    GATE_RELEASED = "gate_released"  # the admission gate let a box in that is not ready (latch, bound, share)
    # warm state
    WARM_TRANSITION = "warm_transition"
    WARM_DROPPED = "warm_dropped"  # a record that died with its process (a new epoch)
    # prefixes and prompts
    PREFIX_VERSION = "prefix_version"
    TOKENIZER_DRIFT = "tokenizer_drift"
    PROMPT_STAGED = "prompt_staged"
    PROMPT_REJECTED = "prompt_rejected"
    PROMPT_CURRENT = "prompt_current"
    # deploy webhook
    DEPLOY_EVENT = "deploy_event"
    DEPLOY_EVENT_REJECTED = "deploy_event_rejected"
