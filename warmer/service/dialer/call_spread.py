"""Where a pre-call answer sends a call among the agent's warm boxes, and what the asks say of demand.

- `CallLedger`: which box each call id was given, so a retried call keeps its box, and how many calls each
  box was handed recently (its load, as the answers see it);
- `pick_least_loaded`: the least loaded of the routes per slot and weight (a ramping box takes its slice),
  ties broken by weighted rendezvous on the call id, so a burst of asks spreads over the group;
- `CallVolumeMeter`: asks per agent over a sliding window, the observed call volume placement reads.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

from warmer.core.readiness import Route
from warmer.ports import Clock


class CallVolumeMeter:
    """Observed pre-call volume per agent over a sliding window, in calls per minute.

    Buckets of one second keep memory bounded under a burst (1,000 asks in a second are one entry)."""

    def __init__(self, clock: Clock, *, window_seconds: float = 60.0) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        self._clock = clock
        self._window = window_seconds
        self._counts: dict[str, deque[list[float]]] = {}  # agent -> [(second, calls)] oldest first

    def add(self, agent_id: str, calls: int = 1) -> None:
        second = math.floor(self._clock.now())
        buckets = self._counts.setdefault(agent_id, deque())
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += calls
        else:
            buckets.append([float(second), float(calls)])
        self._trim(buckets, second)

    def _trim(self, buckets: deque[list[float]], now: float) -> None:
        while buckets and buckets[0][0] <= now - self._window:
            buckets.popleft()

    def calls_per_minute(self) -> dict[str, float]:
        now = self._clock.now()
        result: dict[str, float] = {}
        for agent_id, buckets in list(self._counts.items()):
            self._trim(buckets, now)
            if not buckets:
                del self._counts[agent_id]
                continue
            result[agent_id] = sum(calls for _, calls in buckets) * 60.0 / self._window
        return result


class CallLedger:
    """Calls handed to each box recently, and which box each call was given.

    A box's load is the number of calls handed to it within `window_seconds` (about a call's length), per
    slot: picks go to the least loaded warm box of the agent, so a burst of asks spreads over the group
    instead of queueing on its first box ("spill before you queue"), and a call id keeps its box while that
    box stays in the agent's route. Memory is bounded: at most `max_calls` call ids are remembered."""

    def __init__(self, clock: Clock, *, window_seconds: float = 30.0, max_calls: int = 100_000) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be > 0")
        if max_calls < 1:
            raise ValueError("max_calls must be >= 1")
        self._clock = clock
        self._window = window_seconds
        self._max_calls = max_calls
        self._handed: dict[str, deque[float]] = {}  # box id -> times calls were handed to it, oldest first
        self._calls: OrderedDict[str, str] = OrderedDict()  # call id -> box id, least recent first

    def load(self, box_id: str) -> int:
        times = self._handed.get(box_id)
        if not times:
            return 0
        horizon = self._clock.monotonic() - self._window
        while times and times[0] <= horizon:
            times.popleft()
        return len(times)

    def box_of(self, call_id: str) -> str | None:
        return self._calls.get(call_id)

    def hand(self, box_id: str, call_id: str | None) -> None:
        if call_id is not None:
            if self._calls.get(call_id) == box_id:
                self._calls.move_to_end(call_id)
                return  # a retry of a call already counted on this box
            self._calls[call_id] = box_id
            self._calls.move_to_end(call_id)
            while len(self._calls) > self._max_calls:
                self._calls.popitem(last=False)
        self._handed.setdefault(box_id, deque()).append(self._clock.monotonic())


def pick_least_loaded(
    routes: Sequence[Route],
    call_id: str | None,
    ledger: CallLedger,
    slots: Callable[[str], int],
    rng: random.Random,
) -> Route:
    """The call's box: the one it already has while still routed, else the warm box with the fewest calls
    per slot and weight (a ramping box takes its slice), ties broken by weighted rendezvous on the call."""
    if not routes:
        raise ValueError("no routes to pick from")
    if call_id is not None:
        known = ledger.box_of(call_id)
        for route in routes:
            if route.box_id == known:
                return route
    usable = [r for r in routes if r.weight > 0] or list(routes)
    scores = {r.box_id: (ledger.load(r.box_id) + 1) / (max(1, slots(r.box_id)) * r.weight) for r in usable}
    best = min(scores.values())
    tied = [r for r in usable if scores[r.box_id] <= best * (1 + 1e-9)]
    return tied[0] if len(tied) == 1 else pick_route(tied, call_id, rng)


def _unit(call_id: str, box_id: str) -> float:
    """A stable number in (0, 1) per (call, box)."""
    digest = hashlib.blake2b(f"{call_id}\0{box_id}".encode(), digest_size=8, person=b"warmer-call").digest()
    return (int.from_bytes(digest, "little") + 0.5) / 2.0**64


def pick_route(routes: Sequence[Route], call_id: str | None, rng: random.Random) -> Route:
    """Weighted rendezvous: each box scores -ln(u)/weight, lowest wins, so a box is chosen with
    probability proportional to its weight; with a call id, u is a hash of (call, box), so the same call
    gets the same box while the routes stay the same, and a box leaving moves only its own calls."""
    if not routes:
        raise ValueError("no routes to pick from")
    best: Route | None = None
    best_score = math.inf
    for route in routes:
        if route.weight <= 0:
            continue
        u = _unit(call_id, route.box_id) if call_id is not None else max(rng.random(), 1e-300)
        score = -math.log(u) / route.weight
        if score < best_score:
            best, best_score = route, score
    return best if best is not None else routes[0]
