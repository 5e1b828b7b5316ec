"""A box's health as its lease holder last saw it, shared with the other replicas through the store.

Only a box's lease holder polls its health and epoch; the others read what it saw. So the engines answer
one poll per box per interval, however many replicas run. The rules that keep that safe:

- The holder writes a box's observation only when it changed (healthy or not and how, epoch), and stamps
  its own replica row once per poll round in which it polled every box it holds (`polled_at`, database
  clock): one row per replica per round, not one per box.
- A reader trusts an observation only while its observer still holds the box's lease and stamped a round
  at most `stale_after_seconds` ago (`fresh`); otherwise the box counts as not ready (`HealthFailure.STALE`),
  so no replica ever calls a box ready on a view older than the bound.
- A box without a live holder (a lease released or expired, or none read yet) is polled by every replica
  that sees it so, until one takes the lease: a takeover never leaves a box unpolled.
"""

from __future__ import annotations

from dataclasses import dataclass

# Default `replicas.observation_stale_seconds`: three health polls at the default 5 s.
DEFAULT_STALE_AFTER_SECONDS = 15.0


@dataclass(frozen=True, slots=True)
class HealthObservation:
    """What one poll concluded of a box: healthy with its epoch, or down and how (`HealthFailure` value)."""

    healthy: bool
    epoch: str | None
    failure: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class StoredObservation:
    """A box's observation as the store holds it, aged by the database's clock when it was read."""

    box_id: str
    observation: HealthObservation
    observer: str  # the replica that wrote it
    age_seconds: float | None  # since the observer's last stamped poll round; None: never stamped
    held_by_observer: bool  # the observer holds the box's lease now (database clock)

    def fresh(self, stale_after_seconds: float) -> bool:
        """Whether a reader may act on it: still the holder's, from a poll round within the bound."""
        return (
            self.held_by_observer and self.age_seconds is not None and self.age_seconds <= stale_after_seconds
        )


def validate_stale_after(stale_after_seconds: float, poll_seconds: float) -> None:
    """The bound must cover two poll rounds: one late round of the holder must not blank its boxes on
    every other replica. Raises ValueError naming both figures."""
    if stale_after_seconds < 2 * poll_seconds:
        raise ValueError(
            f"observation_stale_seconds ({stale_after_seconds:g}) must be at least twice "
            f"health_poll_seconds ({poll_seconds:g}): a holder's observation is renewed once per poll"
        )
