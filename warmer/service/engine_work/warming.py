"""Warm a prefix on one box and prove it: "warm" means the engine reported the hit, never "we sent it".

Every round sends the prefix itself (nothing after it), then a probe: the prefix plus a short unique suffix.
The bare prefix matters for running-state (hybrid, Mamba-style) models: SGLang stores their state only where
a request ends (`no_buffer`) or on the checkpoint grid inside it (`extra_buffer`), and a node split by a
diverging request keeps none (see `warmer.core.model.MambaStrategy`). A warm of "prefix + suffix" would put
the only state past the prefix, where no later request can use it; the bare prefix puts it at the prefix's
end (`no_buffer`) or at the last grid point inside it (`extra_buffer`). Dense models get one round;
running-state models repeat rounds until the probe sees the hit, up to a bound.

How far a hit may fall short of the prefix comes from the running server (`EnginePort.cache_layout`: page or
block size, Mamba strategy), the profile's `block_tokens` only when the server does not say
(`warmer.core.warmstate.hit_granularity`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from warmer.core.errors import EngineError
from warmer.core.model import BoxSpec, CacheLayout, CompletionReport, ModelProfile, Prefix
from warmer.core.warmstate import hit_granularity, is_verified, report_contradiction
from warmer.ports import Clock, EnginePort
from warmer.testing import probe_suffix


@dataclass(frozen=True, slots=True)
class WarmOutcome:
    """What one warm-and-verify (or one probe) established, with the evidence."""

    box_id: str
    prefix_hash: str
    verified: bool
    prefix_tokens: int  # what the verification demanded (the engine's own count when it gave one)
    cached_tokens: int | None  # cached prompt tokens the last probe reported (None: no probe answered)
    requests_sent: int
    rounds: int
    wall_seconds: float
    engine_seconds: float | None  # sum of the engine's own timings, when it reports them
    block_tokens: int = 1
    reason: str | None = None  # why it is not verified
    block_source: str = "profile"  # where `block_tokens` came from (the server's report, else the profile)
    ranks: int = 1  # data-parallel ranks warmed and probed (each has its own cache)
    slot: int | None = None  # the engine slot the last request ran in, where the engine has slots
    # False: the engine could not be asked (transport, status, an unreadable answer), so nothing is known
    # of its cache; not verified, yet no evidence of an eviction either
    answered: bool = True
    # True: every request was answered and believed, yet the probe found fewer cached tokens than the warm
    # had just put there: the slot (or cache) was used by something else between the two (a call's turn, a
    # side request). Not the engine's failure: warmed again at once (`reconciler.contests`). Never set for
    # running-state models (their bounded rounds already repeat, and a miss there is about checkpoints) or
    # servers that count their own way (a hosted provider's cache is not one slot to contest).
    contested: bool = False

    def describe(self) -> str:
        cached = "?" if self.cached_tokens is None else str(self.cached_tokens)
        verdict = "verified" if self.verified else f"NOT verified ({self.reason})"
        engine = "" if self.engine_seconds is None else f", engine {self.engine_seconds * 1000:.1f} ms"
        ranks = "" if self.ranks == 1 else f" on each of {self.ranks} DP ranks"
        return (
            f"{self.box_id}: {verdict}: cached {cached} / {self.prefix_tokens} prefix tokens{ranks}"
            f" (block {self.block_tokens} from {self.block_source});"
            f" {self.requests_sent} requests in {self.rounds} round(s),"
            f" {self.wall_seconds * 1000:.1f} ms{engine}"
        )


def _default_nonce() -> str:
    return secrets.token_hex(4)


class WarmExecutor:
    """Sends warm and probe requests through the EnginePort and decides, from the engine's report, if a
    prefix is verified warm. Engine failures become a failed outcome naming the error, never an exception
    the caller must guess about and never a verified outcome."""

    def __init__(
        self,
        engine: EnginePort,
        clock: Clock,
        *,
        max_rounds_running_state: int = 4,
        nonce: Callable[[], str] = _default_nonce,
    ) -> None:
        if max_rounds_running_state < 1:
            raise ValueError(f"max_rounds_running_state must be >= 1, got {max_rounds_running_state}")
        self._engine = engine
        self._clock = clock
        self._max_rounds = max_rounds_running_state
        self._nonce = nonce

    def _probe_suffix(self) -> str:
        return probe_suffix(self._nonce())

    async def _layout(self, box: BoxSpec) -> CacheLayout:
        """What the server reports about its cache; nothing (profile fallback) when it cannot say."""
        try:
            return await self._engine.cache_layout(box)
        except EngineError:
            return CacheLayout()

    async def _start(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, slot: int | None
    ) -> tuple[_Run, list[int | None]]:
        """A fresh tally with the server's granularity, and the data-parallel ranks to go through: each
        rank of an SGLang `--dp-size N` box has its own cache, so a warm and its probe name the rank."""
        layout = await self._layout(box)
        run = _Run(box, profile, prefix, started=self._clock.monotonic(), slot=slot)
        run.block_tokens = hit_granularity(profile, layout)
        run.own_counts = layout.counts_own_tokens
        if layout.page_tokens is not None or layout.mamba_strategy is not None:
            run.block_source = layout.source or "server"
        ranks: list[int | None] = (
            list(range(layout.data_parallel_ranks)) if layout.data_parallel_ranks > 1 else [None]
        )
        run.ranks = len(ranks)
        return run, ranks

    async def _send(
        self, box: BoxSpec, prefix: Prefix, run: _Run, rank: int | None, *, suffix: str = ""
    ) -> CompletionReport:
        """One greedy request in the run's slot (the engine's choice sticks once it reports one) and, on a
        box with data-parallel ranks, on `rank`."""
        if rank is None:
            report = await self._engine.complete_prefix(
                box, prefix, suffix=suffix, max_tokens=1, slot=run.slot
            )
        else:
            report = await self._engine.complete_prefix(
                box, prefix, suffix=suffix, max_tokens=1, slot=run.slot, rank=rank
            )
        if report.slot is not None:
            run.slot = report.slot
        return report

    async def warm_and_verify(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, *, slot: int | None = None
    ) -> WarmOutcome:
        """Warm `prefix` on `box` (every data-parallel rank) and probe until the engine reports the hit
        (bounded); verified only when every rank showed it. `slot` pins every request to that engine slot
        (see `EnginePort.complete_prefix`). Lines logged meanwhile carry the box and prefix (structlog
        contextvars)."""
        with structlog.contextvars.bound_contextvars(box=box.id, prefix=prefix.hash):
            return await self._warm_and_verify(box, profile, prefix, slot)

    async def _warm_and_verify(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, slot: int | None
    ) -> WarmOutcome:
        run, ranks = await self._start(box, profile, prefix, slot)
        rounds = self._max_rounds if profile.running_state else 1
        try:
            for rank in ranks:
                run.rank = rank
                if not await self._warm_rank(box, prefix, run, rank, rounds):
                    contested = not (
                        profile.running_state
                        or run.own_counts
                        or run.unknown_size
                        or run.contradiction is not None
                    )
                    return run.outcome(
                        self._clock.monotonic(),
                        verified=False,
                        reason=run.miss_reason(rounds),
                        contested=contested,
                    )
        except EngineError as exc:
            return run.outcome(
                self._clock.monotonic(), verified=False, reason=run.ranked(f"engine error: {exc}")
            )
        return run.outcome(self._clock.monotonic(), verified=True)

    async def _warm_rank(
        self, box: BoxSpec, prefix: Prefix, run: _Run, rank: int | None, rounds: int
    ) -> bool:
        for round_no in range(1, rounds + 1):
            run.rounds = max(run.rounds, round_no)
            report = await self._send(box, prefix, run, rank)
            run.add(report)
            if run.contradicts(report, suffix=""):
                return False
            # The prefix alone: the engine's own token count for it is the honest bar to clear. A server that
            # counts its own way (a hosted provider) sets the bar alone: warmer's count is in other units.
            own = run.own_counts
            run.prefix_tokens = report.prompt_tokens if own else max(run.prefix_tokens, report.prompt_tokens)
            run.engine_counted = True
            if self._judge(run, await self._probe_report(box, prefix, run, rank)):
                return True
            if run.contradiction is not None:
                return False  # counts that cannot be true: no further round would be believed either
        return False

    async def probe(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, *, slot: int | None = None
    ) -> WarmOutcome:
        """One probe (per data-parallel rank): is the prefix still cached? (It also touches it, like any
        request would.)"""
        with structlog.contextvars.bound_contextvars(box=box.id, prefix=prefix.hash):
            return await self._probe(box, profile, prefix, slot)

    async def _probe(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, slot: int | None
    ) -> WarmOutcome:
        run, ranks = await self._start(box, profile, prefix, slot)
        run.rounds = 1
        try:
            for rank in ranks:
                run.rank = rank
                probe = self._probe_report if not run.own_counts else self._own_count_probe
                if not self._judge(run, await probe(box, prefix, run, rank)):
                    return run.outcome(self._clock.monotonic(), verified=False, reason=run.miss_reason(1))
        except EngineError as exc:
            reason = run.ranked(f"engine error: {exc}")
            return run.outcome(self._clock.monotonic(), verified=False, reason=reason, answered=False)
        return run.outcome(self._clock.monotonic(), verified=True)

    async def _probe_report(
        self, box: BoxSpec, prefix: Prefix, run: _Run, rank: int | None
    ) -> CompletionReport:
        suffix = self._probe_suffix()
        report = await self._send(box, prefix, run, rank, suffix=suffix)
        run.add(report)
        run.contradicts(report, suffix=suffix)
        # Over several ranks the outcome carries the smallest last hit: what every rank holds at least.
        run.last_cached[rank] = report.cached_tokens
        run.cached_tokens = min(run.last_cached.values())
        run.cache_note = report.cache_note
        return report

    async def _own_count_probe(
        self, box: BoxSpec, prefix: Prefix, run: _Run, rank: int | None
    ) -> CompletionReport:
        """A probe on a server that counts its own way: the prefix alone, whose count is the bar and whose
        hit is the answer (a hosted provider: the request also refreshes the entry, as a touch should)."""
        report = await self._send(box, prefix, run, rank)
        run.add(report)
        run.prefix_tokens = report.prompt_tokens
        run.engine_counted = True
        run.contradicts(report, suffix="")
        run.last_cached[rank] = report.cached_tokens
        run.cached_tokens = min(run.last_cached.values())
        run.cache_note = report.cache_note
        return report

    @staticmethod
    def _judge(run: _Run, probe: CompletionReport) -> bool:
        if run.prefix_tokens <= 0:
            run.unknown_size = True  # nothing to compare against: "verified" would be vacuous
            return False
        if run.contradiction is not None:
            return False  # counts that cannot be true of what was sent prove nothing
        return is_verified(run.prefix_tokens, probe.cached_tokens, run.block_tokens)


class _Run:
    """Mutable tally of one warm-and-verify: evidence accumulates, then freezes into a WarmOutcome."""

    def __init__(
        self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, *, started: float, slot: int | None = None
    ) -> None:
        self.box = box
        self.slot = slot  # pinned by the caller, else the slot the engine chose for the first request
        self.prefix = prefix
        self.started = started
        self.block_tokens = max(1, profile.block_tokens)
        self.block_source = "profile"
        self.prefix_tokens = prefix.token_count
        self.engine_counted = False  # the engine has counted the prefix sent alone in this run
        self.own_counts = False  # the server counts tokens its own way (`CacheLayout.counts_own_tokens`)
        self.cached_tokens: int | None = None
        self.cache_note: str | None = None
        self.requests = 0
        self.rounds = 0
        self.engine_seconds: float | None = None
        self.contradiction: str | None = None  # why the last report cannot be true of what was sent
        self.unknown_size = False
        self.rank: int | None = None  # the data-parallel rank being warmed (None: the box has one)
        self.last_cached: dict[int | None, int] = {}  # the last probe's cached tokens, per rank
        self.ranks = 1

    def ranked(self, reason: str) -> str:
        return reason if self.rank is None else f"DP rank {self.rank}: {reason}"

    def contradicts(self, report: CompletionReport, *, suffix: str) -> bool:
        """Hold `report` against what was sent (the prefix at the current bar, then `suffix`); remember why
        it cannot be true, if it cannot."""
        self.contradiction = report_contradiction(
            bar_tokens=self.prefix_tokens,
            sent_prefix_tokens=self.sent_prefix_tokens(),
            suffix=suffix,
            prompt_tokens=report.prompt_tokens,
            cached_tokens=report.cached_tokens,
        )
        return self.contradiction is not None

    def sent_prefix_tokens(self) -> int | None:
        """What warmer knows the prefix to be: the engine's own ids it holds, else the engine's count of
        the prefix sent alone in this run; None while only the engine can count it."""
        if self.prefix.token_ids is not None and not self.own_counts:
            return len(self.prefix.token_ids)
        return self.prefix_tokens if self.engine_counted else None

    def add(self, report: CompletionReport) -> None:
        self.requests += 1
        if report.engine_seconds is not None:
            self.engine_seconds = (self.engine_seconds or 0.0) + report.engine_seconds

    def miss_reason(self, rounds: int) -> str:
        if self.unknown_size:
            return "the prefix's token count is unknown (0), so no probe can prove it cached"
        if self.contradiction is not None:
            return self.ranked(f"the engine's report contradicts what warmer sent: {self.contradiction}")
        note = f"; {self.cache_note}" if self.cache_note else ""
        return self.ranked(
            f"probe saw {self.last_cached.get(self.rank)} cached of {self.prefix_tokens} prefix tokens"
            f" (need >= {self.prefix_tokens - self.block_tokens}) after {rounds} round(s){note}"
        )

    def outcome(
        self,
        now: float,
        *,
        verified: bool,
        reason: str | None = None,
        answered: bool = True,
        contested: bool = False,
    ) -> WarmOutcome:
        return WarmOutcome(
            box_id=self.box.id,
            prefix_hash=self.prefix.hash,
            verified=verified,
            prefix_tokens=self.prefix_tokens,
            cached_tokens=self.cached_tokens,
            requests_sent=self.requests,
            rounds=self.rounds,
            wall_seconds=max(0.0, now - self.started),
            engine_seconds=self.engine_seconds,
            block_tokens=self.block_tokens,
            reason=None if verified else reason,
            block_source=self.block_source,
            ranks=self.ranks,
            slot=self.slot,
            answered=answered,
            contested=contested,
        )
