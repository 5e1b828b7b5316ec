"""Warm a prefix on one box and prove it: "warm" means the engine reported the hit, never "we sent it".

Dense models get one warm request (the prefix itself) and then a probe. Running-state (hybrid, Mamba-style)
models keep state only at checkpointed points, so each round sends the profile's number of warm requests,
each the prefix plus a different short suffix (a request that diverges right after the prefix makes the
engine checkpoint there), then probes; rounds repeat until the probe sees the hit, up to a bound.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from warmer.core.errors import EngineError
from warmer.core.model import BoxSpec, CompletionReport, ModelProfile, Prefix
from warmer.core.warmstate import is_verified
from warmer.ports import Clock, EnginePort


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

    def describe(self) -> str:
        cached = "?" if self.cached_tokens is None else str(self.cached_tokens)
        verdict = "verified" if self.verified else f"NOT verified ({self.reason})"
        engine = "" if self.engine_seconds is None else f", engine {self.engine_seconds * 1000:.1f} ms"
        return (
            f"{self.box_id}: {verdict}: cached {cached} / {self.prefix_tokens} prefix tokens"
            f" (block {self.block_tokens}); {self.requests_sent} requests in {self.rounds} round(s),"
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
        return f"\n#probe {self._nonce()}"

    def _warm_suffix(self, round_no: int, index: int) -> str:
        return f"\n#warm {round_no}.{index} {self._nonce()}"

    async def warm_and_verify(self, box: BoxSpec, profile: ModelProfile, prefix: Prefix) -> WarmOutcome:
        """Warm `prefix` on `box` and probe until the engine reports the hit (bounded). Lines logged
        meanwhile carry the box and prefix (structlog contextvars)."""
        with structlog.contextvars.bound_contextvars(box=box.id, prefix=prefix.hash):
            return await self._warm_and_verify(box, profile, prefix)

    async def _warm_and_verify(self, box: BoxSpec, profile: ModelProfile, prefix: Prefix) -> WarmOutcome:
        run = _Run(box, profile, prefix, started=self._clock.monotonic())
        rounds = self._max_rounds if profile.running_state else 1
        try:
            for round_no in range(1, rounds + 1):
                run.rounds = round_no
                if profile.running_state:
                    for index in range(max(1, profile.warm_requests_per_prefix)):
                        suffix = self._warm_suffix(round_no, index)
                        run.add(await self._engine.complete_prefix(box, prefix, suffix=suffix, max_tokens=1))
                else:
                    report = await self._engine.complete_prefix(box, prefix, max_tokens=1)
                    run.add(report)
                    # The prefix alone: the engine's own token count for it is the honest bar to clear.
                    run.prefix_tokens = max(run.prefix_tokens, report.prompt_tokens)
                if self._judge(run, await self._probe_report(box, prefix, run)):
                    return run.outcome(self._clock.monotonic(), verified=True)
        except EngineError as exc:
            return run.outcome(self._clock.monotonic(), verified=False, reason=f"engine error: {exc}")
        return run.outcome(self._clock.monotonic(), verified=False, reason=run.miss_reason(rounds))

    async def probe(self, box: BoxSpec, profile: ModelProfile, prefix: Prefix) -> WarmOutcome:
        """One probe: is the prefix still cached? (It also touches it, like any request would.)"""
        with structlog.contextvars.bound_contextvars(box=box.id, prefix=prefix.hash):
            return await self._probe(box, profile, prefix)

    async def _probe(self, box: BoxSpec, profile: ModelProfile, prefix: Prefix) -> WarmOutcome:
        run = _Run(box, profile, prefix, started=self._clock.monotonic())
        run.rounds = 1
        try:
            verified = self._judge(run, await self._probe_report(box, prefix, run))
        except EngineError as exc:
            return run.outcome(self._clock.monotonic(), verified=False, reason=f"engine error: {exc}")
        reason = None if verified else run.miss_reason(1)
        return run.outcome(self._clock.monotonic(), verified=verified, reason=reason)

    async def _probe_report(self, box: BoxSpec, prefix: Prefix, run: _Run) -> CompletionReport:
        report = await self._engine.complete_prefix(box, prefix, suffix=self._probe_suffix(), max_tokens=1)
        run.add(report)
        run.cached_tokens = report.cached_tokens
        run.probe_prompt_tokens = report.prompt_tokens
        return report

    @staticmethod
    def _judge(run: _Run, probe: CompletionReport) -> bool:
        if run.prefix_tokens <= 0:
            run.unknown_size = True  # nothing to compare against: "verified" would be vacuous
            return False
        if probe.prompt_tokens < run.prefix_tokens:
            run.inconsistent = True  # the probe holds the prefix and more: a smaller count proves nothing
            return False
        return is_verified(run.prefix_tokens, probe.cached_tokens, run.block_tokens)


class _Run:
    """Mutable tally of one warm-and-verify: evidence accumulates, then freezes into a WarmOutcome."""

    def __init__(self, box: BoxSpec, profile: ModelProfile, prefix: Prefix, *, started: float) -> None:
        self.box = box
        self.prefix = prefix
        self.started = started
        self.block_tokens = max(1, profile.block_tokens)
        self.prefix_tokens = prefix.token_count
        self.cached_tokens: int | None = None
        self.probe_prompt_tokens: int | None = None
        self.requests = 0
        self.rounds = 0
        self.engine_seconds: float | None = None
        self.inconsistent = False
        self.unknown_size = False

    def add(self, report: CompletionReport) -> None:
        self.requests += 1
        if report.engine_seconds is not None:
            self.engine_seconds = (self.engine_seconds or 0.0) + report.engine_seconds

    def miss_reason(self, rounds: int) -> str:
        if self.unknown_size:
            return "the prefix's token count is unknown (0), so no probe can prove it cached"
        if self.inconsistent:
            return (
                f"probe counted {self.probe_prompt_tokens} prompt tokens, fewer than the"
                f" {self.prefix_tokens}-token prefix it contains: token counts disagree"
            )
        return (
            f"probe saw {self.cached_tokens} cached of {self.prefix_tokens} prefix tokens"
            f" (need >= {self.prefix_tokens - self.block_tokens}) after {rounds} round(s)"
        )

    def outcome(self, now: float, *, verified: bool, reason: str | None = None) -> WarmOutcome:
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
        )
