"""BlockManager: allocation, reference counts, prefix caching, LRU eviction, no leaks."""

from __future__ import annotations

import itertools

import pytest
from core.block_manager import BlockManager, hash_block
from core.sequence import Sequence

_ids = itertools.count()


def make_seq(tokens: list[int]) -> Sequence:
    return Sequence(next(_ids), f"req-{next(_ids)}", tokens, None, 0.0)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """Allocate and 'run' the whole sequence, as the scheduler + model would."""
    bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_blocks(seq)


def test_allocate_and_free_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(list(range(10)))
    assert bm.can_allocate(seq, 10)
    bm.allocate(seq, 10)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 5
    assert bm.usage == pytest.approx(3 / 8)
    bm.allocate(seq, 13)  # grows by one block
    assert len(seq.block_table) == 4 and bm.num_free_blocks == 4
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 8 and bm.usage == 0.0
    bm.check_no_leaks()


def test_cannot_allocate_beyond_capacity():
    bm = BlockManager(num_blocks=2, block_size=4)
    a, b = make_seq(list(range(8))), make_seq(list(range(100, 102)))
    bm.allocate(a, 8)
    assert not bm.can_allocate(b, 2)
    with pytest.raises(RuntimeError, match="can_allocate"):
        bm.allocate(b, 2)
    assert b.block_table == []
    assert bm.can_ever_fit(8) and not bm.can_ever_fit(9)
    bm.free(a)
    bm.check_no_leaks()


def test_second_identical_prompt_reuses_all_full_blocks_but_one_token():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(16))  # exactly four full blocks
    a = make_seq(prompt)
    compute_all(bm, a)
    a_blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_cached_blocks == 4
    b = make_seq(prompt)
    assert bm.match_prefix(b) == 12  # the last block is recomputed: one token must run
    bm.allocate(b, 16)
    assert b.num_computed_tokens == b.num_cached_tokens == 12
    assert b.block_table[:3] == a_blocks[:3]
    assert b.block_table[3] != a_blocks[3]  # the recomputed block is not the cached one
    assert bm.prefix_cache_queries == 32 and bm.prefix_cache_hits == 12
    bm.free(b)
    bm.check_no_leaks()


def test_shared_blocks_are_ref_counted():
    bm = BlockManager(num_blocks=16, block_size=4)
    prompt = list(range(9))  # two full blocks + one token
    a = make_seq(prompt)
    compute_all(bm, a)
    b, c = make_seq(prompt), make_seq(prompt)
    bm.allocate(b, 9)
    bm.allocate(c, 9)
    assert a.block_table[:2] == b.block_table[:2] == c.block_table[:2]
    assert len({a.block_table[2], b.block_table[2], c.block_table[2]}) == 3  # partial blocks are private
    assert bm.num_free_blocks == 16 - 5
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 16 - 3  # the shared blocks are still held by c
    assert bm.num_cached_blocks == 0
    bm.free(c)
    assert bm.num_cached_blocks == 2
    bm.check_no_leaks()


def test_partial_block_is_never_cached():
    bm = BlockManager(num_blocks=16, block_size=8)
    prompt = list(range(12))  # one full block + 4 tokens
    a = make_seq(prompt)
    compute_all(bm, a)
    bm.free(a)
    assert bm.num_cached_blocks == 1
    # the same 12 tokens followed by more: the second block was partial, so only 8 hit
    b = make_seq(prompt + list(range(50, 62)))
    assert bm.match_prefix(b) == 8
    bm.check_no_leaks()


def test_hash_is_chained_so_same_block_after_other_prefix_misses():
    bm = BlockManager(num_blocks=16, block_size=4)
    x, y, z = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    for tokens in (x + y + [0], z + [0]):
        s = make_seq(tokens)
        compute_all(bm, s)
        bm.free(s)
    assert bm.num_cached_blocks == 3  # x, y-after-x, z
    # y after z has the same tokens as the cached y-after-x block, but another parent
    assert bm.match_prefix(make_seq(z + y + [0])) == 4
    assert bm.match_prefix(make_seq(x + y + [0])) == 8
    assert bm.match_prefix(make_seq(y + [0])) == 0
    assert hash_block(b"", y) != hash_block(hash_block(b"", x), y)
    assert hash_block(b"", x) == hash_block(b"", list(x))  # deterministic


def test_lru_eviction_order():
    bm = BlockManager(num_blocks=4, block_size=2)
    prompts = {name: [i, i + 1, 99] for name, i in (("p", 10), ("q", 20), ("r", 30))}
    for name in ("p", "q", "r"):  # each caches one full block
        s = make_seq(prompts[name])
        compute_all(bm, s)
        bm.free(s)
    assert bm.num_cached_blocks == 3
    touched = make_seq(prompts["p"])  # a hit makes p the most recently used
    bm.allocate(touched, 3)
    bm.free(touched)
    # two fresh blocks: the one free block, then the least recently used cached one (q)
    other = make_seq([1, 2, 3, 4])
    bm.allocate(other, 4)
    assert bm.match_prefix(make_seq(prompts["q"])) == 0
    assert bm.match_prefix(make_seq(prompts["r"])) == 2
    assert bm.match_prefix(make_seq(prompts["p"])) == 2
    bm.allocate(other, 6)  # next victim: r
    assert bm.match_prefix(make_seq(prompts["r"])) == 0
    assert bm.match_prefix(make_seq(prompts["p"])) == 2
    bm.free(other)
    bm.check_no_leaks()


def test_a_freed_sequence_loses_its_tail_before_its_prefix():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)
    bm.free(a)  # two cached blocks, one free
    other = make_seq([9, 9, 9, 9])
    bm.allocate(other, 4)  # the free block, then one eviction
    assert bm.match_prefix(make_seq([1, 2, 3, 4, 5])) == 2
    bm.free(other)
    bm.check_no_leaks()


def test_blocks_in_use_are_not_evicted_and_hits_count_against_free():
    bm = BlockManager(num_blocks=3, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)  # 3 blocks, 2 of them full and cached
    bm.free(a)
    b = make_seq([1, 2, 3, 4, 6])
    assert bm.can_allocate(b, 5)  # 2 hits + 1 new block = the whole cache
    bm.allocate(b, 5)
    assert b.num_cached_tokens == 4 and bm.num_free_blocks == 0
    c = make_seq([7, 8])
    assert not bm.can_allocate(c, 2)
    bm.free(b)
    bm.check_no_leaks()


def test_duplicate_content_computed_concurrently_is_freed_not_cached():
    bm = BlockManager(num_blocks=8, block_size=2)
    a, b = make_seq([1, 2, 3]), make_seq([1, 2, 3])
    bm.allocate(a, 3)
    bm.allocate(b, 3)  # nothing cached yet: both compute block [1, 2]
    for s in (a, b):
        s.num_computed_tokens = 3
        bm.cache_blocks(s)
    bm.free(a)
    bm.free(b)
    assert bm.num_cached_blocks == 1
    bm.check_no_leaks()


def test_prefix_caching_disabled():
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = make_seq([1, 2, 3, 4, 5])
    compute_all(bm, a)
    bm.free(a)
    assert bm.num_cached_blocks == 0
    b = make_seq([1, 2, 3, 4, 5])
    assert bm.match_prefix(b) == 0
    bm.allocate(b, 5)
    assert b.num_computed_tokens == 0 and bm.prefix_cache_queries == 0
    bm.free(b)
    bm.check_no_leaks()


def test_leak_check_detects_a_held_block():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3])
    bm.allocate(a, 3)
    with pytest.raises(AssertionError, match="still referenced"):
        bm.check_no_leaks()
    bm.free(a)
    bm.check_no_leaks()


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0)])
def test_bad_sizes_are_rejected(num_blocks, block_size):
    with pytest.raises(ValueError, match="must be >= 1"):
        BlockManager(num_blocks, block_size)


def test_skip_prefix_cache_reads_nothing_but_still_caches():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3, 4, 5])
    a.skip_prefix_cache = True
    compute_all(bm, a)
    bm.free(a)
    assert bm.num_cached_blocks == 2 and bm.prefix_cache_queries == 0
    b = make_seq([1, 2, 3, 4, 5])
    b.skip_prefix_cache = True
    assert bm.match_prefix(b) == 0
    assert bm.match_prefix(make_seq([1, 2, 3, 4, 5])) == 4
    bm.check_no_leaks()


def test_blocks_behind_every_window_are_given_back_once():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(list(range(14)))
    compute_all(bm, seq)  # 4 blocks; the first 3 full and cached
    bm.free_before(seq, 9)  # positions 0-7 are behind: blocks 0 and 1
    assert seq.num_freed_blocks == 2 and len(seq.block_table) == 4
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 2  # hashed: still in the prefix cache
    bm.free_before(seq, 5)  # a smaller position frees nothing more
    assert seq.num_freed_blocks == 2 and bm.num_free_blocks == 6
    other = make_seq(list(range(10)))  # reuses the first prompt's two cached blocks
    assert bm.match_prefix(other) == 8
    compute_all(bm, other)
    assert other.block_table[:2] == seq.block_table[:2]
    bm.free(seq)  # only the blocks it still holds
    assert seq.num_freed_blocks == 0 and seq.block_table == []
    bm.free(other)
    bm.check_no_leaks()
