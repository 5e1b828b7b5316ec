"""The admission gate: whether traffic may reach a box, a readiness answer that fails safe.

`readiness.box_ready` is the truth (is every prefix kept warm here verified warm?) and never bends. A
gate wired into an engine pod's readiness probe or a gateway's health check must also never take a fleet
down, which the truth alone would: after a first deploy, a region restart or with an engine that cannot
verify, every box of a model is "not ready" at once, and a probe on the truth drains the whole Service.
The routers' own peer-bootstrap gates learned the same rules, and they are the rules here:

- latch open: a box that was ready in its current epoch stays admitted (an eviction or a new agent on it
  is warmer's work to repair, not a reason to pull a serving engine out of its Service);
- bound the hold: a box held out longer than `max_hold_seconds` since its engine came up is released;
- never hold out every box of a model (or of a box group), nor more than `max_held_share` of them: the
  boxes held longest are released first, so a fleet restarting together comes back box by box.

A released box is admitted with `ready` still false and the reason it was let in; nothing here ever says
a box is warm that is not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GateConfig:
    """`max_hold_seconds`: the longest a healthy box is held out (0: never held, the gate is the engine's
    own health). `max_held_share`: of a model's (or box group's) healthy boxes, the share that may be held
    out at once; at least one of them is always admitted."""

    max_hold_seconds: float = 300.0
    max_held_share: float = 0.5

    def __post_init__(self) -> None:
        if self.max_hold_seconds < 0:
            raise ValueError("max_hold_seconds must be >= 0")
        if not 0.0 <= self.max_held_share < 1.0:
            raise ValueError("max_held_share must be within [0, 1)")


@dataclass(frozen=True, slots=True)
class GateBox:
    """One box as the gate sees it. `healthy_since`: when its engine came up in this epoch (None: down);
    `was_ready`: it was ready at some time in this epoch (or already serving when warmer started)."""

    box_id: str
    model: str
    group: str | None
    healthy_since: float | None
    ready: bool
    was_ready: bool


@dataclass(frozen=True, slots=True)
class GateAnswer:
    admit: bool
    ready: bool
    reason: str  # why admitted or held: "ready", or the release, or what it waits for
    # admitted although not ready, and by which rule (`LATCHED`, `HELD_TOO_LONG`, `SHARE`): a loud signal
    release: str | None = None

    @property
    def released(self) -> bool:
        return self.release is not None


LATCHED = "latched"
HELD_TOO_LONG = "held_too_long"
SHARE = "share"


READY = GateAnswer(True, True, "ready")


def gate(boxes: Iterable[GateBox], now: float, config: GateConfig) -> dict[str, GateAnswer]:
    """Every box's answer. Boxes that are down are held (their engine's own probe fails anyway) and do not
    count towards a model's share."""
    answers: dict[str, GateAnswer] = {}
    held: dict[str, GateBox] = {}
    listed = list(boxes)
    for box in listed:
        if box.healthy_since is None:
            answers[box.box_id] = GateAnswer(False, False, "engine down")
        elif box.ready:
            answers[box.box_id] = READY
        elif box.was_ready:
            answers[box.box_id] = GateAnswer(
                True, False, "latched open: ready earlier in this engine epoch", LATCHED
            )
        elif now - box.healthy_since >= config.max_hold_seconds:
            answers[box.box_id] = GateAnswer(
                True, False, f"held out longer than {config.max_hold_seconds:g} s: released", HELD_TOO_LONG
            )
        else:
            answers[box.box_id] = GateAnswer(False, False, "warming: held until ready")
            held[box.box_id] = box
    for kind, key_of in (("model", _model), ("group", _group)):
        for key, members in _sets(listed, key_of).items():
            _release_over_share(kind, key, members, held, answers, config)
    return answers


def _model(box: GateBox) -> str | None:
    return box.model


def _group(box: GateBox) -> str | None:
    return box.group


def _sets(boxes: Iterable[GateBox], key_of: Callable[[GateBox], str | None]) -> Mapping[str, list[GateBox]]:
    sets: dict[str, list[GateBox]] = {}
    for box in boxes:
        key = key_of(box)
        if key is not None and box.healthy_since is not None:
            sets.setdefault(key, []).append(box)
    return sets


def _release_over_share(
    kind: str,
    key: str,
    members: list[GateBox],
    held: dict[str, GateBox],
    answers: dict[str, GateAnswer],
    config: GateConfig,
) -> None:
    """Release the longest-held boxes of one set until at most its share (and never all) are held."""
    allowed = min(len(members) - 1, math.floor(config.max_held_share * len(members)))
    holding = sorted((b for b in members if b.box_id in held), key=lambda b: (b.healthy_since, b.box_id))
    excess = len(holding) - max(0, allowed)
    for box in holding[: max(0, excess)]:
        held.pop(box.box_id)
        answers[box.box_id] = GateAnswer(
            True,
            False,
            f"released: holding it would hold out more than {config.max_held_share:.0%} of the "
            f"{len(members)} healthy boxes of {kind} {key!r}",
            SHARE,
        )
