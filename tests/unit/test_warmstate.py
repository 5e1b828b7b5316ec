"""The warm-state machine: legal paths, illegal ones raise, verification granularity, backoff."""

from __future__ import annotations

from dataclasses import replace

import pytest

from warmer.core.model import WarmState
from warmer.core.warmstate import (
    EpochChanged,
    IllegalTransition,
    KeepaliveDue,
    ProbeCold,
    ProbeWarm,
    Released,
    RetryBackoff,
    WarmContested,
    WarmEvent,
    WarmFailed,
    WarmStarted,
    WarmVerified,
    is_serving,
    is_verified,
    new_record,
    report_contradiction,
    retry_at,
    suffix_token_ceiling,
    transition,
)
from warmer.testing import probe_suffix


def test_is_verified_uses_engine_granularity() -> None:
    # llama.cpp recomputes the last token: 999 of 1000 is a full hit.
    assert is_verified(1000, 999, 1)
    assert not is_verified(1000, 998, 1)
    # vLLM CPU counts whole 128-token blocks: a 1001-token repeat reports 896.
    assert is_verified(1001, 896, 128)
    assert not is_verified(1001, 768, 128)


@pytest.mark.parametrize(("prefix", "cached", "block"), [(-1, 0, 1), (10, -1, 1), (10, 5, 0)])
def test_is_verified_rejects_nonsense(prefix: int, cached: int, block: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        is_verified(prefix, cached, block)


def test_happy_path_cold_warming_warm() -> None:
    record = new_record("box-1", "epoch-1", "p1", 1000, now=0.0)
    warming = transition(record, WarmStarted(), now=1.0)
    assert warming.state is WarmState.WARMING
    assert warming.attempts == 1
    assert not is_serving(warming)
    warm = transition(warming, WarmVerified(cached_tokens=999), now=2.0)
    assert warm.state is WarmState.WARM
    assert (warm.warmed_at, warm.verified_at, warm.verified_cached_tokens, warm.attempts) == (
        2.0,
        2.0,
        999,
        0,
    )
    assert is_serving(warm)
    assert record.state is WarmState.COLD  # input untouched


def test_a_miss_on_verification_is_a_failure_not_warm() -> None:
    warming = transition(new_record("b", "e", "p", 1000, 0.0), WarmStarted(), 1.0)
    failed = transition(warming, WarmVerified(cached_tokens=4), 2.0)
    assert failed.state is WarmState.FAILED
    assert failed.last_error is not None
    assert "cached 4 of 1000" in failed.last_error


def test_keepalive_cycle_keeps_serving_and_warm_since() -> None:
    warm = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    stale = transition(warm, KeepaliveDue(), 200.0)
    assert stale.state is WarmState.STALE
    assert is_serving(stale)
    touching = transition(stale, WarmStarted(), 201.0)
    assert is_serving(touching)  # a keepalive touch must not flap readiness
    again = transition(touching, WarmVerified(99), 202.0)
    assert again.state is WarmState.WARM
    assert again.warmed_at == 2.0  # the warm stretch continues
    assert again.verified_at == 202.0


def test_failed_keepalive_touch_drops_serving() -> None:
    warm = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    touching = transition(transition(warm, KeepaliveDue(), 200.0), WarmStarted(), 201.0)
    failed = transition(touching, WarmFailed("timeout"), 202.0)
    assert failed.state is WarmState.FAILED
    assert not is_serving(failed)
    assert failed.warmed_at is None


def test_probe_paths() -> None:
    warm = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    rechecked = transition(warm, ProbeWarm(99), 50.0)
    assert (rechecked.state, rechecked.verified_at, rechecked.warmed_at) == (WarmState.WARM, 50.0, 2.0)
    with pytest.raises(IllegalTransition, match="ProbeCold"):
        transition(warm, ProbeWarm(10), 50.0)
    evicted = transition(warm, ProbeCold(3), 60.0)
    assert evicted.state is WarmState.EVICTED
    assert not is_serving(evicted)
    assert transition(evicted, WarmStarted(), 61.0).state is WarmState.WARMING


def test_failed_waits_for_backoff() -> None:
    backoff = RetryBackoff(initial_seconds=10.0, max_seconds=60.0)
    failed = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmFailed("x"), 2.0
    )
    assert retry_at(failed, backoff) == 12.0
    with pytest.raises(IllegalTransition, match="backoff"):
        transition(failed, WarmStarted(), 11.9, backoff)
    second = transition(failed, WarmStarted(), 12.0, backoff)
    assert second.attempts == 2
    failed_twice = transition(second, WarmFailed("x"), 13.0)
    assert retry_at(failed_twice, backoff) == 33.0  # doubles
    many = replace(failed_twice, attempts=40)
    assert retry_at(many, backoff) == 13.0 + 60.0  # capped


def test_a_contested_warm_stays_warming_and_vouches_for_nothing_meanwhile() -> None:
    warm = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    touching = transition(transition(warm, KeepaliveDue(), 200.0), WarmStarted(), 201.0)
    assert is_serving(touching)
    contested = transition(touching, WarmContested(cached_tokens=3, slot=1), 202.0)
    assert (contested.state, contested.attempts, contested.warmed_at) == (WarmState.WARMING, 1, None)
    assert not is_serving(contested)  # the engine was just seen without it
    assert contested.last_error == "contested: cached 3 of 100 tokens in slot 1"
    again = transition(contested, WarmVerified(99), 203.0)  # the re-warm of the same attempt
    assert (again.state, again.attempts, again.warmed_at) == (WarmState.WARM, 0, 203.0)
    failed = transition(contested, WarmFailed("contested 3 times"), 203.0)
    assert retry_at(failed, RetryBackoff()) == 203.0 + RetryBackoff().initial_seconds  # the backoff as before
    for record in (warm, transition(warm, KeepaliveDue(), 200.0), failed):
        with pytest.raises(IllegalTransition):
            transition(record, WarmContested(0), 204.0)
    with pytest.raises(ValueError, match="contested_rewarms"):
        RetryBackoff(contested_rewarms=-1)


def test_new_epoch_resets_from_any_state() -> None:
    warm = transition(
        transition(new_record("b", "e1", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    stale = transition(warm, KeepaliveDue(), 3.0)
    for record in (warm, stale, transition(stale, WarmStarted(), 4.0)):
        fresh = transition(record, EpochChanged("e2"), 10.0)
        assert (fresh.epoch, fresh.state, fresh.attempts, fresh.verified_at, fresh.warmed_at) == (
            "e2",
            WarmState.COLD,
            0,
            None,
            None,
        )
    with pytest.raises(IllegalTransition, match="same epoch"):
        transition(warm, EpochChanged("e1"), 10.0)


@pytest.mark.parametrize(
    ("state_path", "event"),
    [
        ((), WarmVerified(99)),  # cold cannot be verified without a warm
        ((), KeepaliveDue()),
        ((), ProbeCold()),
        (("start",), WarmStarted()),  # coalescing: never two warms at once
        (("start",), Released()),  # a warm is in flight
        (("start", "verify"), WarmStarted()),  # warm must go stale first
        (("start", "verify", "stale"), KeepaliveDue()),
        (("start", "fail"), WarmVerified(99)),
    ],
)
def test_illegal_transitions_raise(state_path: tuple[str, ...], event: WarmEvent) -> None:
    record = new_record("b", "e", "p", 100, 0.0)
    steps: dict[str, WarmEvent] = {
        "start": WarmStarted(),
        "verify": WarmVerified(99),
        "stale": KeepaliveDue(),
        "fail": WarmFailed("x"),
    }
    for i, step in enumerate(state_path):
        record = transition(record, steps[step], float(i + 1))
    with pytest.raises(IllegalTransition):
        transition(record, event, 100.0)


def test_release_stops_vouching() -> None:
    warm = transition(
        transition(new_record("b", "e", "p", 100, 0.0), WarmStarted(), 1.0), WarmVerified(99), 2.0
    )
    released = transition(warm, Released("idle"), 5.0)
    assert released.state is WarmState.COLD
    assert not is_serving(released)


PROBE = probe_suffix("0a1b2c3d")  # the executor's probe suffix shape: 16 bytes


def contradiction(
    prompt: int, cached: int, *, bar: int = 100, sent: int | None = 100, suffix: str = PROBE
) -> str | None:
    return report_contradiction(
        bar_tokens=bar, sent_prefix_tokens=sent, suffix=suffix, prompt_tokens=prompt, cached_tokens=cached
    )


def test_suffix_token_ceiling_is_three_per_byte_plus_one() -> None:
    assert suffix_token_ceiling("") == 0
    assert suffix_token_ceiling(PROBE) == 49
    assert suffix_token_ceiling("\u00e9") == 7  # two UTF-8 bytes


def test_true_reports_are_no_contradiction() -> None:
    assert contradiction(116, 99) is None  # llama.cpp full hit: the last prefix token recomputed
    assert contradiction(116, 108) is None  # the previous probe's "\n#probe " shared too
    assert contradiction(100, 0, suffix="") is None  # the prefix alone, cold
    assert contradiction(300, 0, bar=100, sent=None, suffix="") is None  # a text prefix: the engine counts


def test_a_hit_larger_than_its_prompt_contradicts() -> None:
    assert contradiction(116, 117) == "claims 117 cached of only 116 prompt tokens"


def test_a_hit_larger_than_what_warmer_sent_contradicts() -> None:
    # 100 prefix tokens + at most 49 for the suffix + 2 specials = 151.
    expected = "claims 10000 cached, more than the at most 151 tokens warmer sent"
    assert contradiction(10_001, 10_000) == expected
    assert contradiction(152, 151) is None
    assert contradiction(153, 152) is not None
    # The bar raised by the engine's own count does not raise what warmer sent.
    assert contradiction(5_010, 5_000, bar=5_000, sent=100) is not None


def test_a_prompt_shorter_than_its_prefix_contradicts() -> None:
    assert contradiction(40, 0, suffix="") == "counted 40 prompt tokens, fewer than the 100-token prefix sent"
    assert contradiction(60, 50, sent=None) is not None  # a probe holds the prefix and more
    assert contradiction(40, 0, sent=None, suffix="") is None  # a text prefix alone: the engine counts it


def test_a_text_prefix_only_the_engine_has_counted_bounds_no_hit() -> None:
    assert contradiction(700, 620, bar=140, sent=None) is None
