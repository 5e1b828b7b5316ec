"""Fleet-wide admission of engine work: restart warm-ups, warms and probes against one prefill budget.

Each box's own warm budget (`warm_budget`) keeps warming from becoming that box's load; nothing there sees
the fleet. When a region restarts, every box's restart warm-up and then every prefix warm would start in
the same second: the rest of the fleet takes the moved calls while the daemon floods the engines and the
database at once. This is the rule that paces them:

* a fleet token bucket of uncached prompt tokens per second (`FleetBudget`; configured, or derived from the
  boxes' declared prefill rates, `fleet_rate`), plus a cap on pieces of work in flight fleet-wide, plus the
  per-box concurrency of the box's warm budget;
* most valuable first: a piece of work is worth the prefill its agents' prefixes save a minute
  (`placement.loans.prefix_value`: calls a minute x prefix tokens, the figure loans rank by); a restart
  warm-up is worth what its box held. Ties go in arrival order;
* never starve: work that waited longer than `max_wait_seconds` goes before any fresher work, oldest first.
  Nothing is dropped; low-value work waits;
* urgent work (a pre-call warm: a call is about to use it) is admitted at once and still pays the bucket,
  so the paced work behind it waits longer;
* order is strict: when the next piece cannot be afforded, nothing behind it jumps ahead (a cheap prefix
  cannot keep overtaking a long one). Only a piece whose own box is at its concurrency is passed over.

Pure: the service (`warmer.service.engine_work.fleet_pacer`) does the waiting on this state.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from warmer.core.model import ModelProfile
from warmer.core.placement.loans import prefix_value
from warmer.core.warm_budget import TokenBucket

_SHORT_PROMPT_TOKENS = 64
_ROUNDING = 1e-6  # tokens: a bucket this close to a cost affords it


class WorkKind(enum.StrEnum):
    RESTART_WARMUP = "restart_warmup"
    WARM = "warm"
    PROBE = "probe"


@dataclass(frozen=True, slots=True)
class FleetBudget:
    """The fleet's warming budget. `tokens_per_second` None: derived (`fleet_rate`)."""

    tokens_per_second: float | None = None
    warm_share: float = 0.25  # of each box's declared prefill rate, for the derived figure
    max_in_flight: int = 64  # pieces of engine work running fleet-wide (the database and the daemon too)
    max_wait_seconds: float = 120.0  # older waiting work goes first, whatever its value
    burst_seconds: float = 1.0  # bucket size, in seconds of the rate

    def __post_init__(self) -> None:
        if self.tokens_per_second is not None and not self.tokens_per_second > 0:
            raise ValueError("tokens_per_second must be > 0 (or None: derived from the boxes)")
        if not 0.0 < self.warm_share <= 1.0:
            raise ValueError("warm_share must be in (0, 1]")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if not self.max_wait_seconds > 0:
            raise ValueError("max_wait_seconds must be > 0")
        if not self.burst_seconds > 0:
            raise ValueError("burst_seconds must be > 0")


def fleet_rate(budget: FleetBudget, declared: Iterable[float | None], per_box_fallback: float) -> float:
    """Uncached tokens per second the fleet may spend warming: the configured figure, else each box's
    declared prefill rate x `warm_share` summed, a box without one counting its own warm budget."""
    if budget.tokens_per_second is not None:
        return budget.tokens_per_second
    total = sum(budget.warm_share * rate if rate else per_box_fallback for rate in declared)
    return max(total, per_box_fallback)


def restart_warmup_cost(profile: ModelProfile, long_prefill_tokens: int, slots: int) -> float:
    """Prompt tokens one restart warm-up sends, from above: the long prefill, plus a short prompt per
    sampled, constrained and burst request (64 tokens each; the recipe's are shorter). A hosted model runs
    none of it."""
    if profile.provider is not None:
        return 0.0
    recipe = profile.restart
    short = (recipe.sampled is not None) + (recipe.constrained is not None)
    levels = {max(1, min(level, slots)) for level in recipe.burst_levels}
    if recipe.burst_levels:
        levels.add(slots)
    return float(max(0, long_prefill_tokens) + _SHORT_PROMPT_TOKENS * (short + sum(levels)))


def warm_value(agent_ids: Iterable[str], prefix_tokens: int, volume: Mapping[str, float]) -> float:
    """What a warm of one prefix is worth: the prefill it saves a minute for the agents sharing it."""
    return sum(prefix_value(volume.get(agent, 0.0), prefix_tokens) for agent in agent_ids)


def box_values(
    groups: Mapping[str, Iterable[str]], volume: Mapping[str, float], tokens: Mapping[str, int]
) -> dict[str, float]:
    """Box -> what its agents' prefixes are worth there (agent -> its boxes in `groups`): the value of
    a restart warm-up of the box, which every prefix warm there waits for."""
    values: dict[str, float] = {}
    for agent, group in groups.items():
        worth = prefix_value(volume.get(agent, 0.0), tokens.get(agent, 0))
        if worth <= 0:
            continue
        for box_id in group:
            values[box_id] = values.get(box_id, 0.0) + worth
    return values


def carried_values(before: Mapping[str, float], now: Mapping[str, float]) -> dict[str, float]:
    """`now`, keeping the last value of a box that has none now: placement takes a restarted box's agents
    elsewhere until its warm-up is done, and they come back to it then, so it is still worth what it held."""
    return {**before, **now}


@dataclass(frozen=True, slots=True)
class Ticket:
    """One piece of engine work asking to run."""

    key: str  # unique while it waits or runs
    kind: WorkKind
    box_id: str
    value: float  # prefill saved a minute once done (higher first)
    cost_tokens: float  # uncached prompt tokens it will send, as estimated
    queued_at: float
    urgent: bool = False


@dataclass(slots=True)
class FleetAdmission:
    """Waiting and running work against one fleet budget. `rate` from `fleet_rate`; `box_limit(box_id)`:
    the box's warm concurrency."""

    budget: FleetBudget
    rate: float
    box_limit: Callable[[str], int]
    bucket: TokenBucket | None = None
    running: dict[str, Ticket] = field(default_factory=dict)
    per_box: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, tuple[int, Ticket]] = field(default_factory=dict)
    _by_value: list[tuple[float, int, str]] = field(default_factory=list)  # heap of (-value, seq, key)
    _by_age: deque[tuple[int, str]] = field(default_factory=deque)  # arrival order
    _urgent: list[Ticket] = field(default_factory=list)
    _blocked: Ticket | None = None  # the ticket the bucket stopped at on the last `admit`
    _seq: int = 0

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError("rate must be > 0")

    @property
    def burst(self) -> float:
        return self.rate * self.budget.burst_seconds

    def tokens(self, now: float) -> float:
        """Tokens in the bucket as of `now` (negative: debt an urgent or oversized piece left)."""
        self._refill(now)
        assert self.bucket is not None
        return self.bucket.tokens

    def set_rate(self, rate: float, now: float) -> None:
        if not rate > 0:
            raise ValueError("rate must be > 0")
        self._refill(now)
        self.rate = rate

    def waiting(self) -> list[Ticket]:
        return [ticket for _, ticket in self._waiting.values()]

    def enqueue(self, ticket: Ticket) -> None:
        if ticket.key in self._waiting or ticket.key in self.running:
            raise ValueError(f"ticket {ticket.key!r} is already waiting or running")
        self._seq += 1
        self._waiting[ticket.key] = (self._seq, ticket)
        if ticket.urgent:
            self._urgent.append(ticket)
            return
        heapq.heappush(self._by_value, (-ticket.value, self._seq, ticket.key))
        self._by_age.append((self._seq, ticket.key))

    def charge(self, tokens: float, now: float) -> None:
        """Spend `tokens` more for work already running (a contested warm warmed again within its
        admission): the bucket may go into debt, which later admissions wait out, as after an urgent one."""
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        self._refill(now)
        assert self.bucket is not None
        self.bucket = replace(self.bucket, tokens=self.bucket.tokens - tokens)

    def withdraw(self, key: str) -> None:
        """Forget a waiting ticket (its work was cancelled); a running one is `release`d instead."""
        self._waiting.pop(key, None)

    def release(self, key: str) -> None:
        ticket = self.running.pop(key, None)
        if ticket is not None:
            left = self.per_box.get(ticket.box_id, 0) - 1
            if left > 0:
                self.per_box[ticket.box_id] = left
            else:
                self.per_box.pop(ticket.box_id, None)

    def admit(self, now: float) -> list[Ticket]:
        """Every waiting ticket that may run now, in the order they go (see the module's rules)."""
        self._refill(now)
        self._blocked = None
        admitted: list[Ticket] = []
        self._admit_urgent(admitted)
        if self._admit_aged(now, admitted):
            self._admit_by_value(admitted)
        return admitted

    def next_check_at(self, now: float) -> float | None:
        """When refill alone lets in the ticket the last `admit` stopped at (None: nothing waits on the
        bucket — only on work in flight, or nothing waits)."""
        head = self._blocked
        if head is None or head.key not in self._waiting:
            return None
        self._refill(now)
        assert self.bucket is not None
        need = min(head.cost_tokens, self.burst) - self.bucket.tokens
        return now + max(need, _ROUNDING) / self.rate

    # ------------------------------------------------------------------------------------------ rules

    def _refill(self, now: float) -> None:
        bucket = self.bucket
        if bucket is None:
            self.bucket = TokenBucket(tokens=self.burst, updated_at=now)
            return
        elapsed = max(0.0, now - bucket.updated_at)
        tokens = min(self.burst, bucket.tokens + elapsed * self.rate)
        self.bucket = TokenBucket(tokens=tokens, updated_at=max(now, bucket.updated_at))

    def _admit_urgent(self, admitted: list[Ticket]) -> None:
        urgent, self._urgent = self._urgent, []
        for ticket in urgent:
            if ticket.key in self._waiting:
                self._start(ticket, admitted)

    def _admit_aged(self, now: float, admitted: list[Ticket]) -> bool:
        """Work waiting past `max_wait_seconds`, oldest first; False when the budget stopped it."""
        old_enough = now - self.budget.max_wait_seconds
        passed: list[tuple[int, str]] = []
        go_on = True
        while self._by_age:
            seq, key = self._by_age[0]
            entry = self._waiting.get(key)
            if entry is None or entry[0] != seq:
                self._by_age.popleft()  # admitted by value or withdrawn
                continue
            ticket = entry[1]
            if ticket.queued_at > old_enough:
                break
            verdict = self._fits(ticket)
            if verdict is _Fit.STOP:
                go_on = False
                break
            self._by_age.popleft()
            if verdict is _Fit.BOX_FULL:
                passed.append((seq, key))
                continue
            self._start(ticket, admitted)
        self._by_age.extendleft(reversed(passed))
        return go_on

    def _admit_by_value(self, admitted: list[Ticket]) -> None:
        passed: list[tuple[float, int, str]] = []
        while self._by_value:
            entry = self._by_value[0]
            waiting = self._waiting.get(entry[2])
            if waiting is None or waiting[0] != entry[1]:
                heapq.heappop(self._by_value)
                continue
            verdict = self._fits(waiting[1])
            if verdict is _Fit.STOP:
                break
            heapq.heappop(self._by_value)
            if verdict is _Fit.BOX_FULL:
                passed.append(entry)
                continue
            self._start(waiting[1], admitted)
        for entry in passed:
            heapq.heappush(self._by_value, entry)

    def _box_has_room(self, ticket: Ticket) -> bool:
        return self.per_box.get(ticket.box_id, 0) < self.box_limit(ticket.box_id)

    def _fits(self, ticket: Ticket) -> _Fit:
        if len(self.running) >= self.budget.max_in_flight:
            return _Fit.STOP
        if not self._box_has_room(ticket):
            return _Fit.BOX_FULL
        assert self.bucket is not None
        tokens = self.bucket.tokens
        # `warm_budget.try_spend`'s rule, within rounding (refill over unix-time floats is not exact)
        if ticket.cost_tokens <= tokens + _ROUNDING or tokens >= self.burst - _ROUNDING:
            return _Fit.GO
        self._blocked = ticket
        return _Fit.STOP

    def _start(self, ticket: Ticket, admitted: list[Ticket]) -> None:
        assert self.bucket is not None
        del self._waiting[ticket.key]
        self.bucket = replace(self.bucket, tokens=self.bucket.tokens - ticket.cost_tokens)
        self.running[ticket.key] = ticket
        self.per_box[ticket.box_id] = self.per_box.get(ticket.box_id, 0) + 1
        admitted.append(ticket)


class _Fit(enum.Enum):
    GO = "go"
    BOX_FULL = "box_full"  # pass over it: its own box is busy, the fleet is not
    STOP = "stop"  # fleet in-flight cap or tokens: nothing behind it goes either


def lower_bound_seconds(total_cost_tokens: float, rate: float, burst: float) -> float:
    """The least time a budget of `rate` (bucket `burst`, full at the start) needs to admit this much."""
    if rate <= 0:
        return math.inf
    return max(0.0, total_cost_tokens - burst) / rate
