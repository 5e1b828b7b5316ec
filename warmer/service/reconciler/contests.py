"""Contested warms: a slot overwritten between a warm and its verification is warmed again at once.

On a llama.cpp box a call's turn or a side request can land in the slot a warm just filled (an unslotted
request goes where the engine likes; a call's later turns go back to the slot it was sent to) before the
warm's probe reaches it. The probe then finds fewer cached tokens than the warm put there: the warm did
nothing wrong, the slot was contested (`WarmOutcome.contested`). Failing it would hold the prefix in the
retry backoff (5 s first) and answer a pre-call ask that waits on it "failed" after its whole wait.

Instead, within the same piece of engine work (so asks waiting on it are answered by how it ends), the
record notes the contest and vouches for nothing meanwhile (`WarmContested`), and the prefix is warmed
again at once, in a free slot nothing else is about to use where there is one (`WarmBook.pin_for`: the
contested slot last, a slot in another call or lent to a side request before it), up to
`RetryBackoff.contested_rewarms` times, on the same healthy process while its room is not lent away. A
warm still contested after that fails into the backoff as before, and its later attempts get no re-warms
until the prefix is verified again (an engine that never holds a prefix is no warm storm either); an
engine error never is a contest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import structlog

from warmer.core.model import BoxCapacity, BoxSpec, ModelProfile, Prefix, WarmRecord
from warmer.core.planner import WarmKey
from warmer.core.warmstate import WarmContested, transition
from warmer.service.engine_work.warming import WarmExecutor, WarmOutcome
from warmer.service.reconciler.records import WarmBook
from warmer.service.reconciler.restart_detection import BoxHealth
from warmer.service.reconciler.types import ReconcileObserver, ReconcilerConfig


class ContestedWarms:
    """`warm(...)`: a warm's outcome after the bounded re-warms its contests earn."""

    def __init__(
        self,
        *,
        executor: WarmExecutor,
        book: WarmBook,
        health: BoxHealth,
        config: ReconcilerConfig,
        observer: ReconcileObserver,
        log: structlog.stdlib.BoundLogger,
        now: Callable[[], float],
        blocked: Callable[[str, str], bool],
        charge: Callable[[float], None] = lambda _tokens: None,
    ) -> None:
        self._executor = executor
        self._book = book
        self._health = health
        self._config = config
        self._observer = observer
        self._log = log
        self._now = now
        self._blocked = blocked
        self._charge = charge  # the fleet pacer admitted one warm's tokens: each re-warm spends its own

    def pin(self, key: WarmKey, avoid: frozenset[int] = frozenset()) -> int | None:
        """The slot a warm of `key` goes to (`WarmBook.pin_for`, preferring one nothing else is using)."""
        capacity: Mapping[str, BoxCapacity] = self._health.capacity
        hold = self._config.precall_call_hold_seconds
        return self._book.pin_for(key, capacity.get(key[0]), now=self._now(), hold=hold, avoid=avoid)

    def _same_process(self, key: WarmKey) -> bool:
        live = self._health.live.get(key[0])
        return (
            live is not None and live.healthy and live.epoch == key[1] and not self._blocked(key[0], key[2])
        )

    async def warm(
        self,
        key: WarmKey,
        started: WarmRecord,
        box: BoxSpec,
        profile: ModelProfile,
        prefix: Prefix,
        reason: str,
    ) -> tuple[WarmRecord, WarmOutcome]:
        """Warm and verify the prefix (`started`: its record, warming), again while the outcome is contested,
        up to the bound: (the record, warming still, and the last outcome, for `ActionRunner._finish` to
        write as before)."""

        async def once(slot: int | None) -> WarmOutcome:
            return await self._executor.warm_and_verify(box, profile, prefix, slot=slot)

        outcome = await once(self.pin(key))
        # only the first attempt since the prefix was last verified (or released, or new) is warmed again: a
        # prefix that failed already is not, so an engine that never holds a prefix costs 2 warms more once
        limit = self._config.planner.retry.contested_rewarms if started.attempts <= 1 else 0
        record, avoid = started, frozenset[int]()
        contests = 0
        while outcome.contested and contests < limit and self._same_process(key):
            contests += 1
            self._spent(key[0], outcome, reason)
            cached = outcome.cached_tokens or 0
            record, previous = transition(record, WarmContested(cached, outcome.slot), self._now()), record
            why = f"warm contested ({reason}): {outcome.reason}; warmed again ({contests} of {limit})"
            await self._book.write(record, reason=why, previous=previous.state)
            self._log.info(
                "warm contested: its slot was overwritten before the probe; warming again",
                slot=outcome.slot,
                cached=outcome.cached_tokens,
                rewarm=contests,
            )
            if outcome.slot is not None:
                avoid |= {outcome.slot}
            self._book.release_pin(key)
            self._charge(float(prefix.token_count * profile.warm_requests_per_prefix))
            outcome = await once(self.pin(key, avoid))
        if outcome.contested:
            times = f"{contests + 1} time(s) in a row"
            outcome = replace(outcome, reason=f"{outcome.reason}; slot contested {times}: backing off")
        return record, outcome

    def _spent(self, box_id: str, outcome: WarmOutcome, reason: str) -> None:
        """A contested attempt's engine work counts like any warm's (the last one's is counted on finish)."""
        live = self._health.live[box_id]
        live.prefix_engine_seconds += outcome.engine_seconds or 0.0
        live.prefix_requests += outcome.requests_sent
        self._observer.warm_finished(box_id, "warm", reason, "contested", outcome.wall_seconds)
        self._observer.warm_tokens(box_id, outcome.prefix_tokens * outcome.requests_sent)
