"""Residency of warmed prefixes from KV cache events (`warmer.core.residency`).

The events come from `FakeCache` (tests/unit/kv_cache_fakes.py), built as vLLM builds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.kv_cache_fakes import BS, FakeCache
from warmer.core.kv_event_stream import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvent,
    EventBatch,
    SequenceCursor,
    SeqVerdict,
    replay_covers,
)
from warmer.core.residency import BoxResidency, MirrorOverflow, PrefixResidency, PrefixState, block_digests


def ids(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


def states(changes: Sequence[PrefixResidency]) -> dict[str, tuple[PrefixState, int]]:
    return {c.prefix_hash: (c.state, c.resident_tokens) for c in changes}


def test_a_warms_stored_blocks_make_its_prefix_resident() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(13)  # 3 full blocks + 1 token that is never cached
    assert box.watch("p", prefix) == []  # no block size known yet: nothing to say

    changes = box.apply([cache.store(prefix)])

    assert states(changes) == {"p": (PrefixState.RESIDENT, 12)}
    view = box.state("p")
    assert view is not None
    assert view.tracked_tokens == 12


def test_blocks_stored_in_several_prefill_chunks_are_chained_by_parent_hash() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(16)
    box.watch("p", prefix)

    first = box.apply([cache.store(prefix, end_block=2)])
    second = box.apply([cache.store(prefix, start_block=2)])

    assert first == []  # half seen: still unknown, not "evicted"
    assert box.state("p") == PrefixResidency("p", PrefixState.RESIDENT, 16, 16, BS)
    assert states(second) == {"p": (PrefixState.RESIDENT, 16)}


def test_removing_a_block_evicts_the_prefix_and_a_hit_reaches_only_the_blocks_before_it() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(16)
    box.watch("p", prefix)
    box.apply([cache.store(prefix)])

    evicted = box.apply([cache.evict(prefix, 2)])
    restored = box.apply([cache.store(prefix, start_block=2)])

    assert states(evicted) == {"p": (PrefixState.EVICTED, 8)}
    assert states(restored) == {"p": (PrefixState.RESIDENT, 16)}


def test_losing_the_first_block_leaves_nothing_reachable() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(12)
    box.watch("p", prefix)
    box.apply([cache.store(prefix)])

    assert states(box.apply([cache.evict(prefix, 0)])) == {"p": (PrefixState.EVICTED, 0)}


def test_blocks_another_request_stored_before_the_watch_count_at_once() -> None:
    cache, box = FakeCache(), BoxResidency()
    shared = ids(8)
    other_agent = [*shared, *ids(8, start=500)]
    box.apply([cache.store(other_agent)])

    changes = box.watch("p", [*shared, 7])  # the same first two blocks, then a partial block

    assert states(changes) == {"p": (PrefixState.RESIDENT, 8)}


def test_a_prefix_that_diverges_inside_a_block_holds_only_the_blocks_before() -> None:
    cache, box = FakeCache(), BoxResidency()
    stored = ids(12)
    box.apply([cache.store(stored)])
    diverging = [*stored[:6], 9999, *stored[7:]]

    box.watch("p", diverging)

    view = box.state("p")
    assert view is not None
    assert (view.state, view.resident_tokens) == (PrefixState.UNKNOWN, 4)


def test_a_hash_is_held_or_not_whatever_number_of_stores_announced_it() -> None:
    # A second store of a held hash (a duplicate copy, or a "full" report of a reused block) changes
    # nothing; one removal drops it: a missed eviction would be worse than a re-warm that hits.
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    box.apply([cache.store(prefix), cache.store(prefix)])

    one_removal = box.apply([cache.evict(prefix, 1)])

    assert states(one_removal) == {"p": (PrefixState.EVICTED, 4)}
    assert box.blocks == 1


def test_lora_blocks_and_offloaded_copies_are_not_the_warms_blocks() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    stored = cache.store(prefix)
    lora = BlockStored(stored.block_hashes, None, stored.token_ids, BS, plain=False)
    offloaded = BlockStored(stored.block_hashes, None, stored.token_ids, BS, medium="CPU")

    assert box.apply([lora, offloaded]) == []
    assert box.blocks == 0
    assert states(box.apply([stored])) == {"p": (PrefixState.RESIDENT, 8)}
    assert box.apply([BlockRemoved(stored.block_hashes, medium="CPU")]) == []


def test_a_prefix_shorter_than_one_block_cannot_be_tracked() -> None:
    cache, box = FakeCache(), BoxResidency()
    box.watch("short", ids(3))
    box.apply([cache.store(ids(8))])
    box.apply([AllBlocksCleared()])

    assert box.state("short") == PrefixResidency("short", PrefixState.UNKNOWN, 0, 0, BS)


def test_all_blocks_cleared_evicts_every_trackable_prefix_even_one_never_seen() -> None:
    cache, box = FakeCache(), BoxResidency()
    seen, never = ids(8), ids(8, start=300)
    box.watch("seen", seen)
    box.watch("never", never)
    box.apply([cache.store(seen)])

    changes = box.apply([AllBlocksCleared(), cache.store(ids(4, start=900))])

    assert states(changes) == {"seen": (PrefixState.EVICTED, 0), "never": (PrefixState.EVICTED, 0)}
    assert box.blocks == 1  # the store after the clear counts


def test_clear_is_the_restart_answer_and_new_hashes_are_learned_again() -> None:
    old, box = FakeCache(salt=1), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    box.apply([old.store(prefix)])

    assert states(box.clear()) == {"p": (PrefixState.EVICTED, 0)}
    new = FakeCache(salt=2)
    assert states(box.apply([new.store(prefix)])) == {"p": (PrefixState.RESIDENT, 8)}
    assert box.apply([old.evict(prefix, 0)]) == []  # a hash of the old process means nothing now


def test_losing_track_makes_every_prefix_unknown_until_it_is_stored_again() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    box.apply([cache.store(prefix)])

    lost = box.lose_track()
    after = box.apply([cache.evict(prefix, 1)])
    again = box.apply([cache.store(prefix, start_block=0)])

    assert states(lost) == {"p": (PrefixState.UNKNOWN, 0)}
    assert after == []
    assert states(again) == {"p": (PrefixState.RESIDENT, 8)}


def test_a_change_is_reported_once_and_unrelated_events_report_nothing() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    first = box.apply([cache.store(prefix)])
    unrelated = box.apply([cache.store(ids(8, start=700)), cache.evict(ids(8, start=700), 0)])
    evicted_and_back = box.apply([cache.evict(prefix, 1), cache.store(prefix, start_block=1)])

    assert len(first) == 1
    assert unrelated == []
    assert evicted_and_back == []  # net unchanged within one batch
    assert box.state("p") == PrefixResidency("p", PrefixState.RESIDENT, 8, 8, BS)


def test_rewatching_with_other_ids_replaces_the_old_chain() -> None:
    cache, box = FakeCache(), BoxResidency()
    a, b = ids(8), ids(8, start=400)
    box.watch("p", a)
    box.apply([cache.store(a)])

    box.watch("p", b)
    evicting_a = box.apply([cache.evict(a, 0)])

    assert evicting_a == []  # the old ids are no longer followed
    assert states(box.apply([cache.store(b)])) == {"p": (PrefixState.RESIDENT, 8)}
    box.forget("p")
    assert box.state("p") is None
    assert box.apply([cache.evict(b, 0)]) == []


def test_every_kv_cache_group_must_hold_the_prefix() -> None:
    cache, box = FakeCache(), BoxResidency()
    prefix = ids(8)
    box.watch("p", prefix)
    g0 = cache.store(prefix)
    g1 = BlockStored(g0.block_hashes, None, g0.token_ids, BS, group=1)

    box.apply([g0, g1])
    evicted = box.apply([BlockRemoved((g0.block_hashes[1],), group=1)])

    assert states(evicted) == {"p": (PrefixState.EVICTED, 4)}


def test_a_mirror_past_its_bound_raises_instead_of_growing() -> None:
    cache, box = FakeCache(), BoxResidency(max_blocks=3)
    with pytest.raises(MirrorOverflow):
        box.apply([cache.store(ids(16))])
    with pytest.raises(ValueError, match="max_blocks"):
        BoxResidency(max_blocks=0)


def test_a_run_whose_tokens_do_not_fill_its_blocks_is_not_indexed() -> None:
    box = BoxResidency()
    box.watch("p", ids(8))
    odd = BlockStored((1, 2), None, tuple(ids(7)), BS)
    assert box.apply([odd]) == []
    assert box.blocks == 0


def test_block_digests_cover_full_blocks_only() -> None:
    assert len(block_digests(ids(9), 4)) == 2
    assert block_digests(ids(8), 4)[0] == block_digests(ids(4), 4)[0]
    assert block_digests(ids(3), 4) == ()


def test_the_sequence_cursor_tells_next_gap_and_reset() -> None:
    cursor = SequenceCursor()
    assert cursor.classify(5) is SeqVerdict.FIRST
    assert cursor.expected == 0
    cursor.advance(5)
    assert cursor.classify(6) is SeqVerdict.NEXT
    assert cursor.classify(9) is SeqVerdict.GAP
    assert cursor.expected == 6
    assert cursor.classify(5) is SeqVerdict.RESET  # the same number again: a new publisher
    assert cursor.classify(0) is SeqVerdict.RESET


def test_a_replay_covers_a_gap_only_from_its_start() -> None:
    def batch(seq: int) -> EventBatch:
        return EventBatch(seq=seq, ts=0.0, events=())

    assert replay_covers(6, [batch(6), batch(7)])
    assert replay_covers(6, [batch(3), batch(6)])
    assert not replay_covers(6, [batch(7), batch(8)])  # the replay buffer dropped 6
    assert not replay_covers(6, [])


# -- against a brute-force model: random requests and evictions on a small cache


def reachable_tokens(cache: FakeCache, tokens: Sequence[int]) -> int:
    held = 0
    for h in cache.hashes(tokens):
        if h not in cache.held:
            break
        held += 1
    return held * cache.block_size


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=14), min_size=1, max_size=5),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(0, 3)), max_size=25),
)
def test_residency_matches_a_brute_force_walk_of_the_live_blocks(
    prompts: list[list[int]], steps: list[tuple[bool, int, int]]
) -> None:
    cache, box = FakeCache(), BoxResidency()
    for i, prompt in enumerate(prompts):
        box.watch(f"p{i}", prompt)
    for store, which, block in steps:
        prompt = prompts[which % len(prompts)]
        hashes = cache.hashes(prompt)
        events: list[CacheEvent] = []
        if store and hashes:
            events.append(cache.store(prompt))
        elif hashes and hashes[block % len(hashes)] in cache.held:
            events.append(cache.evict(prompt, block % len(hashes)))
        box.apply(events)
        for i, p in enumerate(prompts):
            view = box.state(f"p{i}")
            assert view is not None
            assert view.resident_tokens == reachable_tokens(cache, p)
            full = len(p) // BS
            resident = full > 0 and reachable_tokens(cache, p) == full * BS
            assert (view.state is PrefixState.RESIDENT) == resident


def test_the_eviction_horizon_is_the_low_end_of_other_blocks_ages_at_eviction() -> None:
    """Ages on the engine's batch timestamps, from the last BlockStored of a block (a re-announcement by a
    "full" report counts as a use); a watched prefix's own blocks do not count (their loss is an eviction
    reported as such); nothing is said before enough evictions were seen."""
    cache, residency = FakeCache(), BoxResidency()
    watched = ids(8)
    residency.watch("w", watched)
    residency.apply([cache.store(watched)], ts=0.0)
    others = [ids(4, start=1000 + 4 * i) for i in range(10)]
    for i, other in enumerate(others):
        residency.apply([cache.store(other)], ts=float(i))
    residency.apply([cache.store(others[9])], ts=50.0)  # used again at 50: its age counts from there
    assert residency.horizon.seconds() is None
    residency.apply([cache.evict(watched, 1)], ts=100.0)  # the watched prefix's block: not a sample
    for i, other in enumerate(others[:8]):
        assert residency.horizon.seconds() is None
        residency.apply([cache.evict(other, 0)], ts=100.0 + i)  # age 100 each
    assert residency.horizon.samples == 8
    assert residency.horizon.seconds() == 100.0
    residency.apply([cache.evict(others[8], 0), cache.evict(others[9], 0)], ts=60.0)  # ages 52, 10
    assert residency.horizon.seconds() is not None
    assert residency.horizon.seconds() <= 52.0  # the low end, not the mean


def _sparse_store(cache: FakeCache, tokens: Sequence[int], keep: Sequence[int], group: int) -> BlockStored:
    """A sliding-window / Mamba group's BlockStored as `cache_full_blocks` builds it
    (vllm/v1/core/block_pool.py @ c59cb7941357443da7c5eef75cfa8697d683d228): null blocks skipped in
    `block_hashes`, `token_ids` the whole run, the hashes the request's own (as the attention group's)."""
    hashes = cache.hashes(tokens)
    return BlockStored(
        block_hashes=tuple(hashes[i] for i in keep),
        parent_hash=None,
        token_ids=tuple(tokens[: len(hashes) * cache.block_size]),
        block_size=cache.block_size,
        group=group,
    )


def test_a_hybrid_prefix_is_resident_only_while_its_sparse_group_holds_its_end_block() -> None:
    """Group 0 full attention, group 1 Mamba ("align": only the last block of the run is not null). The
    Mamba group's events were dropped before (their token_ids cover more blocks than their hashes), so the
    prefix read RESIDENT on its attention blocks alone after its running state was gone."""
    cache, residency = FakeCache(), BoxResidency()
    prompt = ids(12)  # three blocks
    residency.watch("p", prompt)
    assert states(residency.apply([cache.store(prompt)])) == {"p": (PrefixState.RESIDENT, 12)}
    changes = residency.apply([_sparse_store(cache, prompt, keep=[2], group=1)])
    assert changes == []  # a new group that holds what the prefix needs: still resident
    view = residency.state("p")
    assert view is not None
    assert (view.state, view.resident_tokens) == (PrefixState.RESIDENT, 12)

    end = cache.hashes(prompt)[2]
    removed = residency.apply([BlockRemoved(block_hashes=(end,), group=1)])
    assert states(removed) == {"p": (PrefixState.EVICTED, 0)}  # no state to resume from
    stored_again = residency.apply([_sparse_store(cache, prompt, keep=[2], group=1)])
    assert states(stored_again) == {"p": (PrefixState.RESIDENT, 12)}


def test_a_group_whose_kind_keeps_some_positions_is_sparse_from_its_first_event() -> None:
    """`kv_cache_spec_kind` "mamba" / "sliding_window...": even a run with no null block is tracked by its
    hashes, and a prefix needs the block at its end there, not the whole chain."""
    cache, residency = FakeCache(), BoxResidency()
    prompt = ids(8)
    residency.watch("p", prompt)
    residency.apply([cache.store(prompt)])
    shorter = ids(4)
    first = cache.hashes(shorter)[0]
    residency.apply(
        [BlockStored((first,), None, tuple(shorter), BS, group=1, sparse=True)]  # another request's block
    )
    view = residency.state("p")
    assert view is not None
    assert view.state is not PrefixState.RESIDENT  # the block at the prefix's end is not held in group 1
    residency.apply([_sparse_store(cache, prompt, keep=[1], group=1)])
    view = residency.state("p")
    assert view is not None
    assert view.state is PrefixState.RESIDENT


def test_with_reproducible_hashes_a_removal_of_a_prefix_never_seen_stored_is_an_eviction() -> None:
    """warmer (re)started after the prefix was warmed: its store is not in the replay any more. Without
    the server's hashes the prefix stays UNKNOWN whatever is removed; with them (a fixed PYTHONHASHSEED and
    sha256_cbor: `hasher`), the removal of one of its blocks is seen as its eviction."""
    cache = FakeCache()
    prompt = ids(12)

    def hasher(tokens: Sequence[int], size: int) -> tuple[int, ...]:
        assert size == BS
        return tuple(cache.hashes(tokens))

    blind, knowing = BoxResidency(), BoxResidency(hasher=hasher, block_size_hint=BS)
    for residency in (blind, knowing):
        residency.watch("p", prompt)
    removal = [cache.evict(prompt, 1)]
    assert blind.apply(removal) == []
    assert states(knowing.apply(removal)) == {"p": (PrefixState.EVICTED, 0)}
    stored = knowing.apply([cache.store(prompt)])  # the re-warm: resident again
    assert states(stored) == {"p": (PrefixState.RESIDENT, 12)}


def test_computed_bytes_hashes_also_match_their_int_form_on_the_wire() -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES sends the low 64 bits of the big-endian bytes
    (vllm/v1/core/kv_cache_utils.py `maybe_convert_block_hash`)."""
    prompt = ids(8)
    digest = bytes(range(32))

    def hasher(tokens: Sequence[int], size: int) -> tuple[bytes, ...]:
        return (digest, digest[::-1])

    residency = BoxResidency(hasher=hasher, block_size_hint=BS)
    residency.watch("p", prompt)
    as_int = int.from_bytes(digest[::-1], "big") & 0xFFFF_FFFF_FFFF_FFFF
    assert states(residency.apply([BlockRemoved(block_hashes=(as_int,))])) == {"p": (PrefixState.EVICTED, 0)}
