"""How a restart is detected for engines that expose no process identity (no start time, no fingerprint).

An adapter feeds `RestartWatch` what it observes of a box (health bounces, fingerprints, counters that only
grow within one process) and reads the box's epoch from it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Watched:
    generation: int = 0
    seen_down: bool = False
    marker: str | None = None
    counter: float | None = None


@dataclass(slots=True)
class RestartWatch:
    """Per-box epoch derived from what this adapter instance has observed, when the engine has no start time.

    The epoch changes when (a) the adapter sees the box go unhealthy/unreachable and come back, (b) an
    engine-side fingerprint changes (model path, build, launch seed), or (c) a counter that only grows
    within one process goes backwards. It embeds a random nonce of this adapter instance, so a restart
    of warmer itself yields new epochs: warmer cannot know the engine did not restart while it was
    away, and the honest answer is to re-verify rather than trust old warm state.
    """

    nonce: str = field(default_factory=lambda: secrets.token_hex(4))
    _boxes: dict[str, _Watched] = field(default_factory=dict)

    def _get(self, box_id: str) -> _Watched:
        return self._boxes.setdefault(box_id, _Watched())

    def saw_health(self, box_id: str, up: bool) -> None:
        watched = self._get(box_id)
        if not up:
            watched.seen_down = True
        elif watched.seen_down:
            watched.seen_down = False
            watched.generation += 1

    def saw_state(self, box_id: str, *, marker: str | None = None, counter: float | None = None) -> None:
        watched = self._get(box_id)
        if marker is not None:
            if watched.marker is not None and marker != watched.marker:
                watched.generation += 1
            watched.marker = marker
        if counter is not None:
            if watched.counter is not None and counter < watched.counter:
                watched.generation += 1
            watched.counter = counter

    def epoch(self, box_id: str) -> str:
        watched = self._get(box_id)
        return f"watch-{self.nonce}-{watched.generation}"

    def generation(self, box_id: str) -> int:
        """Restarts this adapter has seen (bounces, counter resets, marker changes), without the nonce:
        for engines whose own fingerprint already names the process."""
        return self._get(box_id).generation
