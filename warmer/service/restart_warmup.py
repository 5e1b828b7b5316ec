"""Restart warm-up: what a fresh engine process gets before any prefix, and before real traffic.

A new epoch (engine started, restarted, redeployed) has cold kernels as well as a cold cache: the first
sampled request compiles the sampling path, the first constrained request loads the grammar backend, the
first batch at each concurrency captures/compiles for that batch size, and the first very long prefill
allocates the big attention buffers. Real callers should never pay for any of that, so the model profile's
recipe runs these in order (`RestartRecipe`), each phase timed and written to the store as a `PhaseRecord`
(the PREFIXES phase that follows belongs to the reconciler). A failed phase stops the recipe and is
recorded with its reason; the planner retries the whole warm-up later.

The long prefill is also the box's prefill-ceiling measurement: `on_long_prefill` (when given) is told
its engine report (computed prompt tokens and prefill seconds) for the capacity figures.

Engine time: each phase records the engine-reported seconds of its requests summed. `critical_engine_seconds`
is the engine time on the critical path (bursts run concurrently, so a burst level counts its slowest
request once): that is the figure daemon overhead is measured against.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog

from warmer.core.errors import EngineError, ImplausibleReport, NotSupported
from warmer.core.model import BoxSpec, CompletionReport, ModelProfile, PhaseName, PhaseRecord, RestartRecipe
from warmer.core.warmstate import novel_prompt_contradiction
from warmer.ports import Clock, EnginePort, StorePort

# Filler for the long prefill: no spaces (an SPM byte vocabulary spends 3 tokens on one) and no repeats a
# tokenizer could merge into very long tokens, so chars and tokens stay close and sizing converges fast.
_FILLER = "warmup-0123456789|abcdefghij/KLMNOPQRST;"
_SIZING_ROUNDS = 4  # tokenize calls spent on sizing the long prompt at most


@dataclass(frozen=True, slots=True)
class RestartOutcome:
    """The whole recipe on one box for one epoch: every phase run, and whether all succeeded."""

    box_id: str
    epoch: str
    ok: bool
    phases: tuple[PhaseRecord, ...]
    wall_seconds: float
    engine_seconds: float  # engine-reported seconds of every request, summed
    critical_engine_seconds: float  # engine seconds on the critical path (concurrent bursts count once)
    error: str | None = None


@dataclass(slots=True)
class _PhaseTally:
    requests: int = 0
    engine_seconds: float | None = None
    critical_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def add(self, report: CompletionReport) -> None:
        self.requests += 1
        if report.engine_seconds is not None:
            self.engine_seconds = (self.engine_seconds or 0.0) + report.engine_seconds

    def add_concurrent(self, reports: Sequence[CompletionReport]) -> None:
        for report in reports:
            self.add(report)
        timed = [r.engine_seconds for r in reports if r.engine_seconds is not None]
        self.critical_seconds += max(timed, default=0.0)

    def add_sequential(self, report: CompletionReport) -> None:
        self.add(report)
        self.critical_seconds += report.engine_seconds or 0.0


def burst_levels(recipe: RestartRecipe, slots: int) -> tuple[int, ...]:
    """Rising concurrency levels from the recipe, capped at the box's slot count, ending AT the slot count
    (every slot must have been used once before real traffic arrives)."""
    capped = {max(1, min(level, slots)) for level in recipe.burst_levels}
    if recipe.burst_levels:
        capped.add(slots)
    return tuple(sorted(capped))


def long_prefill_target(
    recipe: RestartRecipe, profile: ModelProfile, longest_prefix: int | None = None
) -> int:
    """Prompt tokens of the long prefill: the recipe's figure, else the longest prompt real calls send
    (`longest_prefix` x headroom), never more than the context minus the margin."""
    ceiling = profile.context_length - recipe.long_prefill_margin_tokens
    if recipe.long_prefill_tokens > 0:
        return min(recipe.long_prefill_tokens, ceiling)
    if longest_prefix:
        return min(ceiling, math.ceil(longest_prefix * recipe.long_prefill_headroom))
    return ceiling


class RestartWarmup:
    """Runs a model profile's restart recipe on one box and records each phase in the store."""

    def __init__(
        self,
        engine: EnginePort,
        store: StorePort,
        clock: Clock,
        *,
        nonce: Callable[[], str] = lambda: secrets.token_hex(4),
        on_long_prefill: Callable[[BoxSpec, str, CompletionReport], None] | None = None,
    ) -> None:
        self._engine = engine
        self._store = store
        self._clock = clock
        self._nonce = nonce
        self._on_long_prefill = on_long_prefill

    async def run(
        self, box: BoxSpec, profile: ModelProfile, epoch: str, *, longest_prefix: int | None = None
    ) -> RestartOutcome:
        """The profile's restart recipe on `box`. `longest_prefix`: the longest stable prefix the box's
        model serves, in tokens (sizes the long prefill when the recipe does not fix it). Every line logged
        meanwhile (engine adapters, httpx) is tagged with the box and epoch through structlog's
        contextvars, bursts included."""
        with structlog.contextvars.bound_contextvars(box=box.id, epoch=epoch):
            return await self._run(box, profile, epoch, longest_prefix)

    async def _run(
        self, box: BoxSpec, profile: ModelProfile, epoch: str, longest_prefix: int | None
    ) -> RestartOutcome:
        recipe = profile.restart
        started = self._clock.monotonic()
        phases: list[PhaseRecord] = []
        engine_total = 0.0
        critical = 0.0
        error: str | None = None
        steps: list[tuple[PhaseName, Callable[[_PhaseTally], Awaitable[None]]]] = []
        if recipe.sampled is not None:
            steps.append((PhaseName.SAMPLED, lambda tally: self._sampled(box, recipe, tally)))
        if recipe.constrained is not None:
            steps.append((PhaseName.CONSTRAINED, lambda tally: self._constrained(box, recipe, tally)))
        if recipe.burst_levels:
            steps.append((PhaseName.BURST, lambda tally: self._bursts(box, recipe, tally)))
        long_target = long_prefill_target(recipe, profile, longest_prefix)
        if profile.provider is not None:
            steps = []  # a hosted API: no kernels or grammar backend of ours to load, and every request costs
        elif long_target > 0:
            steps.append(
                (PhaseName.LONG_PREFILL, lambda tally: self._long_prefill(box, long_target, epoch, tally))
            )
        for phase, step in steps:
            record, tally = await self._run_phase(box, epoch, phase, step)
            phases.append(record)
            engine_total += tally.engine_seconds or 0.0
            critical += tally.critical_seconds
            if not record.ok:
                error = f"{phase.value}: {record.error}"
                break
        return RestartOutcome(
            box_id=box.id,
            epoch=epoch,
            ok=error is None,
            phases=tuple(phases),
            wall_seconds=max(0.0, self._clock.monotonic() - started),
            engine_seconds=engine_total,
            critical_engine_seconds=critical,
            error=error,
        )

    async def _run_phase(
        self, box: BoxSpec, epoch: str, phase: PhaseName, step: Callable[[_PhaseTally], Awaitable[None]]
    ) -> tuple[PhaseRecord, _PhaseTally]:
        started_at = self._clock.now()
        await self._store.put_phase(
            PhaseRecord(box_id=box.id, epoch=epoch, phase=phase, started_at=started_at)
        )
        tally = _PhaseTally()
        ok, error = True, None
        try:
            await step(tally)
        except NotSupported as exc:
            tally.notes.append(f"skipped, not supported: {exc}")  # e.g. no grammar backend: nothing to warm
        except EngineError as exc:
            ok, error = False, f"engine error: {exc}"
        if tally.notes and error is None:
            error = "; ".join(tally.notes)  # a note on a successful phase (ok stays True)
        record = PhaseRecord(
            box_id=box.id,
            epoch=epoch,
            phase=phase,
            started_at=started_at,
            finished_at=self._clock.now(),
            engine_seconds=tally.engine_seconds,
            requests=tally.requests,
            ok=ok,
            error=error,
        )
        await self._store.put_phase(record)
        return record, tally

    async def _sampled(self, box: BoxSpec, recipe: RestartRecipe, tally: _PhaseTally) -> None:
        sampled = recipe.sampled
        assert sampled is not None
        report = await self._engine.complete_prompt(
            box, sampled.prompt, max_tokens=sampled.max_tokens, temperature=sampled.temperature
        )
        tally.add_sequential(report)

    async def _constrained(self, box: BoxSpec, recipe: RestartRecipe, tally: _PhaseTally) -> None:
        constrained = recipe.constrained
        assert constrained is not None
        report = await self._engine.complete_prompt(
            box,
            constrained.prompt,
            max_tokens=constrained.max_tokens,
            json_schema=dict(constrained.json_schema),
        )
        tally.add_sequential(report)

    async def _bursts(self, box: BoxSpec, recipe: RestartRecipe, tally: _PhaseTally) -> None:
        nonce = self._nonce()
        for level in burst_levels(recipe, box.slots):
            # Distinct prompts: identical ones could be served from each other's cache instead of batched.
            requests = [
                self._engine.complete_prompt(
                    box,
                    f"Warm-up burst {nonce} level {level} request {index}: count to five.",
                    max_tokens=recipe.burst_max_tokens,
                    temperature=0.7,
                )
                for index in range(level)
            ]
            tally.add_concurrent(await asyncio.gather(*requests))

    async def _long_prefill(self, box: BoxSpec, target: int, epoch: str, tally: _PhaseTally) -> None:
        """One prefill of nearly the longest prompt the box's calls send. Its prompt starts with a fresh
        nonce, so it is also the canary of the engine's cache reports: a hit claimed on it is a lie, and the
        phase fails (the box is never ready on reports that prove nothing)."""
        prompt = await self.long_prompt(box, target)
        report = await self._engine.complete_prompt(box, prompt, max_tokens=1)
        tally.add_sequential(report)
        lie = novel_prompt_contradiction(report.prompt_tokens, report.cached_tokens)
        if lie is not None:
            raise ImplausibleReport(box.id, lie)
        if self._on_long_prefill is not None:
            self._on_long_prefill(box, epoch, report)

    async def long_prompt(self, box: BoxSpec, target_tokens: int) -> str:
        """A prompt of at most `target_tokens` engine tokens, close to it (a fresh nonce first, so it is a
        real prefill even if the engine did not restart).

        Sized with the engine's own tokenizer in a few bounded rounds; an engine that cannot tokenize gets
        one char per token, which a byte-level vocabulary matches and any other undershoots (never over)."""
        head = f"{self._nonce()}:"
        text = (head + _FILLER * (target_tokens // len(_FILLER) + 2))[:target_tokens]
        for _ in range(_SIZING_ROUNDS):
            try:
                count = len(await self._engine.tokenize(box, text))
            except NotSupported:
                return text[: max(1, target_tokens - 8)]  # leave room for BOS and template specials
            if count <= target_tokens and count >= target_tokens * 0.97:
                return text
            scale = target_tokens / max(count, 1)
            length = max(1, int(len(text) * scale * (0.99 if count > target_tokens else 1.0)))
            text = (head + _FILLER * (length // len(_FILLER) + 2))[:length]
        count = len(await self._engine.tokenize(box, text))
        while count > target_tokens and len(text) > 1:  # never exceed the context: trim to fit
            text = text[: max(1, len(text) * target_tokens // count - 1)]
            count = len(await self._engine.tokenize(box, text))
        return text
