"""What the planner asks for: one action type per kind of work, carried out in order by the reconciler.

Warms and probes reach the engine; marking stale, retiring and abandoning are bookkeeping on the warm-state
records (`warmer.core.warmstate` events); a restart warm-up runs the model profile's recipe on a new epoch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from warmer.core.warm_budget import TokenBucket


class WarmReason(enum.StrEnum):
    PRECALL = "precall"
    CAMPAIGN = "campaign"
    ASSIGNED = "assigned"  # an active agent's prefix is not warm here
    KEEPALIVE = "keepalive"


class ProbeReason(enum.StrEnum):
    UNTRUSTED = "untrusted"  # verified before the daemon (re)started: re-verify, do not trust blindly
    SUSPECT = "suspect"  # the box's hit rate dropped


@dataclass(frozen=True, slots=True)
class RunRestartWarmup:
    """Run the model profile's restart recipe on the box, then report the phases for this epoch."""

    box_id: str
    epoch: str


@dataclass(frozen=True, slots=True)
class MarkStale:
    """Apply `KeepaliveDue` to the record (warm -> stale); a `WarmPrefix` for it may follow."""

    box_id: str
    epoch: str
    prefix_hash: str


@dataclass(frozen=True, slots=True)
class WarmPrefix:
    """Send `requests` warm requests of the prefix (distinct short suffixes when > 1: running-state models),
    sequentially; if the last one's cached tokens do not verify, send one bare verification request.

    Record `WarmStarted` before, then `WarmVerified(cached)` or `WarmFailed(error)`. `agent_ids` share the
    prefix here (coalesced into this one warm); use any of them to look the prefix text up.
    """

    box_id: str
    epoch: str
    prefix_hash: str
    prefix_tokens: int
    requests: int
    reason: WarmReason
    agent_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ProbePrefix:
    """Send the prefix once (max_tokens 1) and record `ProbeWarm(cached)` or `ProbeCold(cached)`."""

    box_id: str
    epoch: str
    prefix_hash: str
    prefix_tokens: int
    reason: ProbeReason
    agent_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Retire:
    """Stop keeping this prefix warm here: apply `Released(reason)` (no engine request)."""

    box_id: str
    epoch: str
    prefix_hash: str
    reason: str


@dataclass(frozen=True, slots=True)
class AbandonWarm:
    """A `warming` row has nothing in flight (daemon restart, lost task): apply `WarmFailed(reason)`."""

    box_id: str
    epoch: str
    prefix_hash: str
    reason: str


Action = RunRestartWarmup | MarkStale | WarmPrefix | ProbePrefix | Retire | AbandonWarm


@dataclass(frozen=True, slots=True)
class Plan:
    """Actions in execution order, and the token buckets after charging them (store them for next time)."""

    actions: tuple[Action, ...]
    buckets: Mapping[str, TokenBucket]
