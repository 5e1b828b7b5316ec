"""The warm-state machine of one (box, epoch, prefix): pure transitions over `WarmRecord`.

Legal moves (anything else raises `IllegalTransition`, so a confused caller never writes a lie):

    cold | evicted | stale --WarmStarted--> warming
    failed --WarmStarted (after its backoff)--> warming
    warming --WarmVerified (hit big enough)--> warm
    warming --WarmVerified (hit too small) | WarmFailed--> failed
    warming --WarmContested--> warming        (its slot was overwritten before the probe: warmed again)
    warm --KeepaliveDue--> stale
    warm | stale --ProbeWarm--> warm          (a probe touched it and saw the hit)
    warm | stale --ProbeCold--> evicted
    any but warming --Released--> cold        (we stop vouching: agent idle or moved away)
    any --EpochChanged(new epoch)--> cold     (warm state dies with the engine process)

`warmed_at` marks the start of the current continuous warm stretch (it survives a keepalive touch, so
readiness does not flap every keepalive); `verified_at` is the last time the engine reported the hit, and
keepalive timing counts from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from warmer.core.errors import WarmerError
from warmer.core.model import CacheLayout, MambaStrategy, ModelProfile, WarmRecord, WarmState


class IllegalTransition(WarmerError):
    """An event that cannot happen in the record's current state (a bug or a stale caller)."""

    def __init__(self, record: WarmRecord, event: WarmEvent, detail: str = "") -> None:
        self.record = record
        self.event = event
        what = f"{type(event).__name__} in state {record.state.value}"
        where = f"{record.box_id}/{record.epoch}/{record.prefix_hash}"
        super().__init__(f"{where}: illegal transition: {what}" + (f" ({detail})" if detail else ""))


@dataclass(frozen=True, slots=True)
class WarmStarted:
    """A warm (or keepalive touch) request is about to be sent."""


@dataclass(frozen=True, slots=True)
class WarmVerified:
    """The engine answered the verification request with this many cached prompt tokens."""

    cached_tokens: int
    block_tokens: int = 1  # engine cache granularity (vLLM CPU: 128)


@dataclass(frozen=True, slots=True)
class WarmFailed:
    """The warm request itself failed (transport, status, malformed body)."""

    error: str


@dataclass(frozen=True, slots=True)
class WarmContested:
    """The warm was answered, but its verification probe found fewer cached tokens than the warm had just
    put there: something else (a call's turn, a side request) used the slot or cache in between. Nothing
    is vouched for (the engine was just seen without the prefix); the warm is sent again at once, a bounded
    number of times (`RetryBackoff.contested_rewarms`), and only then fails into the backoff."""

    cached_tokens: int
    slot: int | None = None  # the slot that was overwritten, where the engine has slots


@dataclass(frozen=True, slots=True)
class KeepaliveDue:
    """The prefix should be touched again soon; still believed warm."""


@dataclass(frozen=True, slots=True)
class ProbeWarm:
    """A cheap probe sent the prefix and saw the hit (it also touched the LRU)."""

    cached_tokens: int
    block_tokens: int = 1


@dataclass(frozen=True, slots=True)
class ProbeCold:
    """A probe (or the engine's hit rate) says the engine no longer holds the prefix."""

    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Released:
    """We stop keeping this prefix warm here (agent idle, moved away, or prefix changed)."""

    reason: str = ""


@dataclass(frozen=True, slots=True)
class EpochChanged:
    """The engine process changed: everything it held is gone."""

    new_epoch: str


WarmEvent = (
    WarmStarted
    | WarmVerified
    | WarmFailed
    | WarmContested
    | KeepaliveDue
    | ProbeWarm
    | ProbeCold
    | Released
    | EpochChanged
)


@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """How long a failed prefix waits before the next warm: exponential in consecutive attempts.

    A contested warm (`WarmContested`: the engine answered, the slot was overwritten before the probe) is
    no failure of the engine's: it is warmed again at once, up to `contested_rewarms` times in a row within
    the first attempt since the prefix was last verified, and only then fails into this backoff (a slot
    overwritten again and again is no warm storm; later attempts get no re-warms)."""

    initial_seconds: float = 5.0
    max_seconds: float = 300.0
    contested_rewarms: int = 2

    def __post_init__(self) -> None:
        if self.initial_seconds < 0:
            raise ValueError("initial_seconds must be >= 0")
        if self.contested_rewarms < 0:
            raise ValueError("contested_rewarms must be >= 0")
        if self.max_seconds < self.initial_seconds:
            raise ValueError("max_seconds must be >= initial_seconds")


def is_verified(prefix_tokens: int, cached_tokens: int, block_tokens: int = 1) -> bool:
    """True when the reported hit covers the prefix up to the engine's granularity.

    Engines count hits in whole blocks (vLLM CPU: 128 tokens), so a fully cached prefix may report up to
    one block less; llama.cpp always recomputes the last prompt token, which `block_tokens` >= 1 absorbs.
    """
    if prefix_tokens < 0 or cached_tokens < 0:
        raise ValueError("prefix_tokens and cached_tokens must be >= 0")
    if block_tokens < 1:
        raise ValueError("block_tokens must be >= 1")
    return cached_tokens >= prefix_tokens - block_tokens


# Special tokens (BOS, EOS) an engine may add to a text prompt that warmer's own count of it left out.
SPECIAL_TOKENS_ALLOWANCE = 2


# A prompt made up this moment (a fresh nonce first) can share only its first few tokens with anything an
# engine holds: BOS and a template's specials, the space a SentencePiece tokenizer prefixes, one first
# character that happens to match (llama.cpp with a byte vocabulary: at most 4).
NOVEL_PROMPT_CACHED_ALLOWANCE = 8


def novel_prompt_contradiction(prompt_tokens: int, cached_tokens: int) -> str | None:
    """Why a report of cached tokens for a prompt warmer made up this moment cannot be true, else None: an
    engine that claims a hit there claims hits it does not have (it answers "cached" for everything), and
    none of its cache reports can verify a warm."""
    if cached_tokens <= NOVEL_PROMPT_CACHED_ALLOWANCE:
        return None
    return (
        f"claims {cached_tokens} of {prompt_tokens} tokens cached for a prompt made up this moment "
        f"(at most {NOVEL_PROMPT_CACHED_ALLOWANCE} can be): its cache reports are not believed"
    )


def suffix_token_ceiling(suffix: str) -> int:
    """The most tokens an engine can make of `suffix`: with byte fallback a tokenizer emits at most one
    token per byte, and SentencePiece first turns each space into U+2581 (3 bytes) and may prepend one,
    so 3 per UTF-8 byte plus 1 bounds every tokenizer warmer talks to (byte-level BPE: 1 per byte)."""
    return 3 * len(suffix.encode()) + 1 if suffix else 0


def report_contradiction(
    *, bar_tokens: int, sent_prefix_tokens: int | None, suffix: str, prompt_tokens: int, cached_tokens: int
) -> str | None:
    """Why an engine's token counts for one request cannot be true of what warmer sent, else None: the
    one rule that keeps a lying or buggy engine's report from counting as a verified hit.

    The request was the prefix, then `suffix` as text. `sent_prefix_tokens` is what warmer knows the
    prefix to be (the engine's own token ids it holds, or the engine's count of this prefix sent alone);
    None when only the engine can count it (a text prefix without ids, not yet sent alone). `bar_tokens`
    is the count a probe must reach (the engine may raise it above warmer's, which only makes a hit
    harder to claim). No hit exceeds its prompt; a prompt never holds fewer tokens than the prefix in it;
    and no hit exceeds what warmer sent: the prefix, the most tokens the suffix can make, and the specials
    an engine may add.
    """
    if cached_tokens > prompt_tokens:
        return f"claims {cached_tokens} cached of only {prompt_tokens} prompt tokens"
    if (suffix or sent_prefix_tokens is not None) and prompt_tokens < bar_tokens:
        return f"counted {prompt_tokens} prompt tokens, fewer than the {bar_tokens}-token prefix sent"
    if sent_prefix_tokens is None:
        return None  # only the engine can count this prefix: nothing of warmer's to bound the hit by
    ceiling = sent_prefix_tokens + suffix_token_ceiling(suffix) + SPECIAL_TOKENS_ALLOWANCE
    if cached_tokens > ceiling:
        return f"claims {cached_tokens} cached, more than the at most {ceiling} tokens warmer sent"
    return None


def hit_granularity(profile: ModelProfile, layout: CacheLayout) -> int:
    """The tokens a verified hit may fall short of the prefix by, from what the server reports.

    The server's page/block size wins over the profile's `block_tokens` (a fallback only): SGLang's radix
    cache matches whole pages (mem_cache/radix_cache.py `key.match(..., page_size)`) and several attention
    backends force a page of 16-128 (server_args.py `_handle_attention_backend_compatibility`); vLLM's block
    varies by backend and hybrid model. A hybrid model on SGLang with `extra_buffer` hits only up to the
    last checkpoint, the prefix rounded down to the checkpoint grid, lcm(mamba_cache_chunk_size, page_size)
    with mamba_cache_chunk_size = max(model chunk, page_size) (sglang 0.5.23 arg_groups/overrides.py
    `mamba_cache_chunk_size`, runtime_context.py `mamba_checkpoint_grid`). `no_buffer` stores the state at
    the warm request's end, so the page rule holds (MambaRadixCache asserts page_size 1 there). The
    profile's `mamba_strategy` stands in when the server does not name one.
    """
    page = layout.page_tokens if layout.page_tokens is not None else max(1, profile.block_tokens)
    strategy = layout.mamba_strategy or profile.mamba_strategy
    if profile.running_state and strategy is MambaStrategy.EXTRA_BUFFER:
        chunk = layout.mamba_chunk_tokens or max(profile.mamba_chunk_size, page)
        return math.lcm(chunk, page)
    return page


def is_serving(record: WarmRecord) -> bool:
    """Believed warm right now: warm, stale, or being touched by a keepalive (warmed_at kept)."""
    if record.state in (WarmState.WARM, WarmState.STALE):
        return True
    return record.state is WarmState.WARMING and record.warmed_at is not None


def retry_at(record: WarmRecord, backoff: RetryBackoff) -> float:
    """When a failed record may be warmed again."""
    exponent = max(record.attempts - 1, 0)
    delay = min(backoff.max_seconds, backoff.initial_seconds * (2.0 ** min(exponent, 60)))
    return record.updated_at + delay


def new_record(box_id: str, epoch: str, prefix_hash: str, prefix_tokens: int, now: float) -> WarmRecord:
    """The implicit state of a prefix we have never warmed in this epoch."""
    return WarmRecord(
        box_id=box_id,
        epoch=epoch,
        prefix_hash=prefix_hash,
        state=WarmState.COLD,
        prefix_tokens=prefix_tokens,
        updated_at=now,
    )


def transition(
    record: WarmRecord, event: WarmEvent, now: float, backoff: RetryBackoff | None = None
) -> WarmRecord:
    """Apply one event; return the new record (the input is never changed)."""
    match event:
        case EpochChanged():
            return _epoch_changed(record, event, now)
        case WarmStarted():
            return _warm_started(record, event, now, backoff or RetryBackoff())
        case WarmVerified():
            return _warm_verified(record, event, now)
        case WarmFailed():
            return _warm_failed(record, event, now)
        case WarmContested():
            return _warm_contested(record, event, now)
        case KeepaliveDue():
            return _keepalive_due(record, event, now)
        case ProbeWarm():
            return _probe_warm(record, event, now)
        case ProbeCold():
            return _probe_cold(record, event, now)
        case Released():
            return _released(record, event, now)
    raise TypeError(f"unknown warm event: {event!r}")


def _epoch_changed(record: WarmRecord, event: EpochChanged, now: float) -> WarmRecord:
    if event.new_epoch == record.epoch:
        raise IllegalTransition(record, event, "same epoch")
    return WarmRecord(
        box_id=record.box_id,
        epoch=event.new_epoch,
        prefix_hash=record.prefix_hash,
        state=WarmState.COLD,
        prefix_tokens=record.prefix_tokens,
        updated_at=now,
    )


def _warm_started(record: WarmRecord, event: WarmStarted, now: float, backoff: RetryBackoff) -> WarmRecord:
    state = record.state
    if state is WarmState.FAILED:
        ready_at = retry_at(record, backoff)
        if now < ready_at:
            raise IllegalTransition(record, event, f"backoff until {ready_at:.3f}")
    elif state not in (WarmState.COLD, WarmState.EVICTED, WarmState.STALE):
        raise IllegalTransition(record, event)
    keep_warm_since = record.warmed_at if state is WarmState.STALE else None
    return replace(
        record,
        state=WarmState.WARMING,
        attempts=record.attempts + 1,
        updated_at=now,
        warmed_at=keep_warm_since,
    )


def _warm_verified(record: WarmRecord, event: WarmVerified, now: float) -> WarmRecord:
    if record.state is not WarmState.WARMING:
        raise IllegalTransition(record, event)
    if not is_verified(record.prefix_tokens, event.cached_tokens, event.block_tokens):
        return replace(
            record,
            state=WarmState.FAILED,
            verified_cached_tokens=event.cached_tokens,
            last_error=f"not verified: cached {event.cached_tokens} of {record.prefix_tokens} tokens",
            updated_at=now,
            warmed_at=None,
        )
    return replace(
        record,
        state=WarmState.WARM,
        verified_cached_tokens=event.cached_tokens,
        attempts=0,
        last_error=None,
        updated_at=now,
        warmed_at=record.warmed_at if record.warmed_at is not None else now,
        verified_at=now,
    )


def _warm_failed(record: WarmRecord, event: WarmFailed, now: float) -> WarmRecord:
    if record.state is not WarmState.WARMING:
        raise IllegalTransition(record, event)
    return replace(record, state=WarmState.FAILED, last_error=event.error, updated_at=now, warmed_at=None)


def _warm_contested(record: WarmRecord, event: WarmContested, now: float) -> WarmRecord:
    """Still warming (the same attempt: `attempts` unchanged), vouching for nothing meanwhile: a keepalive
    warm of a prefix believed warm (`warmed_at` kept) stops serving, as the engine was seen without it."""
    if record.state is not WarmState.WARMING:
        raise IllegalTransition(record, event)
    where = "" if event.slot is None else f" in slot {event.slot}"
    return replace(
        record,
        verified_cached_tokens=event.cached_tokens,
        last_error=f"contested: cached {event.cached_tokens} of {record.prefix_tokens} tokens{where}",
        updated_at=now,
        warmed_at=None,
    )


def _keepalive_due(record: WarmRecord, event: KeepaliveDue, now: float) -> WarmRecord:
    if record.state is not WarmState.WARM:
        raise IllegalTransition(record, event)
    return replace(record, state=WarmState.STALE, updated_at=now)


def _probe_warm(record: WarmRecord, event: ProbeWarm, now: float) -> WarmRecord:
    if record.state not in (WarmState.WARM, WarmState.STALE):
        raise IllegalTransition(record, event)
    if not is_verified(record.prefix_tokens, event.cached_tokens, event.block_tokens):
        raise IllegalTransition(
            record,
            event,
            f"cached {event.cached_tokens} of {record.prefix_tokens} is a miss: use ProbeCold",
        )
    return replace(
        record,
        state=WarmState.WARM,
        verified_cached_tokens=event.cached_tokens,
        updated_at=now,
        verified_at=now,
    )


def _probe_cold(record: WarmRecord, event: ProbeCold, now: float) -> WarmRecord:
    if record.state not in (WarmState.WARM, WarmState.STALE):
        raise IllegalTransition(record, event)
    return replace(
        record,
        state=WarmState.EVICTED,
        verified_cached_tokens=event.cached_tokens,
        last_error="probe: evicted",
        updated_at=now,
        warmed_at=None,
    )


def _released(record: WarmRecord, event: Released, now: float) -> WarmRecord:
    if record.state is WarmState.WARMING:
        raise IllegalTransition(record, event, "a warm is in flight")
    return replace(record, state=WarmState.COLD, attempts=0, updated_at=now, warmed_at=None)
