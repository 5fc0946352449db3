"""KV cache block manager: fixed-size blocks, reference counts and automatic prefix caching.

Every block is in exactly one of three states:

- free: ref count 0, no content hash; on the free list;
- cached: ref count 0, holds a full block whose hash is in the prefix cache; evictable,
  kept in LRU order and reclaimed only when the free list is empty;
- in use: ref count > 0 (several sequences share a block found in the prefix cache).

A block's hash chains the hash of the block before it with the block's own tokens, so
equal content after different prefixes never matches; a sequence's chain starts from its
LoRA adapter's key, so KV computed under one adapter (or none) never serves another. Only full, computed blocks are
hashed; they are never written again, which is why sharing them needs no copy-on-write.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from core.sequence import Sequence

_ROOT_HASH = b""  # parent of a sequence's first block


def hash_block(parent_hash: bytes, token_ids: list[int]) -> bytes:
    """Content hash of one full block: sha256 over the parent's hash and the block's tokens.

    A cryptographic hash, not ``hash()``: a crafted prompt must not be able to collide with
    another user's prefix and read its cached KV. Deterministic within a machine.
    """
    return hashlib.sha256(parent_hash + array("q", token_ids).tobytes()).digest()


class BlockManager:
    """Hands out KV cache blocks to sequences and keeps the prefix cache.

    :param num_blocks: blocks in the KV cache (the same count in every layer).
    :param block_size: tokens per block.
    :param enable_prefix_caching: reuse cached full blocks across requests.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._hashes: list[bytes | None] = [None] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._cache: dict[bytes, int] = {}  # block hash -> block id
        self._num_hashed: dict[int, int] = {}  # seq_id -> leading blocks already hashed
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of those, tokens found

    # ---- counters -------------------------------------------------------------------

    @property
    def num_total_blocks(self) -> int:
        """Blocks in the cache."""
        return len(self._ref_counts)

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new allocations: truly free plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Unused blocks that hold prefix-cache content (evictable)."""
        return len(self._evictable)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by live sequences, 0..1."""
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens / queried tokens so far (0.0 before any query)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether one sequence of ``num_tokens`` tokens fits the whole cache."""
        return self.num_blocks_for(num_tokens) <= self.num_total_blocks

    # ---- allocation -----------------------------------------------------------------

    def match_prefix(self, seq: Sequence) -> int:
        """Tokens at the start of ``seq`` held by the prefix cache (a whole number of blocks).

        At least one token is always left to compute, so that the step yields logits.
        Returns 0 when caching is off, ``seq.skip_prefix_cache`` is set or ``seq`` already
        has blocks. Changes nothing.
        """
        return len(self._match_blocks(seq)) * self.block_size

    def holds(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether ``seq``'s blocks already hold its first ``num_tokens`` tokens (no allocation needed)."""
        return num_tokens <= len(seq.block_table) * self.block_size

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether ``seq``'s block table can grow to hold its first ``num_tokens`` tokens.

        For a sequence with no blocks, the cached prefix it would reuse is accounted for.
        """
        hits = self._match_blocks(seq)
        num_new = self.num_blocks_for(num_tokens) - len(seq.block_table) - len(hits)
        # a hit block with no other user comes out of the evictable pool
        num_reclaimed = sum(1 for b in hits if self._ref_counts[b] == 0)
        return max(num_new, 0) + num_reclaimed <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> None:
        """Grow ``seq``'s block table to hold its first ``num_tokens`` tokens.

        A sequence with no blocks first takes the cached blocks of its longest cached
        prefix: ``num_computed_tokens`` and ``num_cached_tokens`` jump to the hit length.
        Raises RuntimeError when ``can_allocate`` is false.
        """
        if not self.can_allocate(seq, num_tokens):
            raise RuntimeError(
                f"Sequence {seq.seq_id}: cannot allocate blocks for {num_tokens} tokens "
                f"({self.num_free_blocks} free); call can_allocate() first"
            )
        if not seq.block_table:
            hits = self._match_blocks(seq)
            if self.enable_prefix_caching and not seq.skip_prefix_cache:
                self.prefix_cache_queries += seq.num_tokens
                self.prefix_cache_hits += len(hits) * self.block_size
            for block_id in hits:
                self._acquire(block_id)
            seq.block_table = list(hits)
            seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
            self._num_hashed[seq.seq_id] = len(hits)
        while len(seq.block_table) < self.num_blocks_for(num_tokens):
            seq.block_table.append(self._take_block())

    def free(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks; hashed ones stay cached until evicted."""
        # last block first, so that a sequence's tail is evicted before its prefix
        for block_id in reversed(seq.block_table[seq.num_freed_blocks :]):
            self._release(block_id)
        seq.block_table = []
        seq.num_freed_blocks = 0
        self._num_hashed.pop(seq.seq_id, None)

    def free_before(self, seq: Sequence, position: int) -> None:
        """Give back ``seq``'s blocks that hold only positions before ``position``: keys no
        layer attends to again (every layer's sliding window has moved past them).

        Their table entries stay in place (positions keep their blocks' indices); attention
        masks those keys, so whatever the blocks hold later is never weighed. Hashed blocks
        stay in the prefix cache until evicted.
        """
        end = min(max(position, 0) // self.block_size, len(seq.block_table))
        for index in range(seq.num_freed_blocks, end):
            self._release(seq.block_table[index])
        seq.num_freed_blocks = max(seq.num_freed_blocks, end)

    def cache_blocks(self, seq: Sequence) -> None:
        """Register ``seq``'s newly full, computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for index in range(self._num_hashed.get(seq.seq_id, 0), num_full):
            block_hash = self._block_hash(seq, index)
            block_id = seq.block_table[index]
            # the same content may already be cached in another block (two equal prompts
            # computed in one step); this copy then stays private and is freed, not cached
            if block_hash not in self._cache:
                self._cache[block_hash] = block_id
                self._hashes[block_id] = block_hash
        self._num_hashed[seq.seq_id] = max(num_full, self._num_hashed.get(seq.seq_id, 0))

    def check_no_leaks(self) -> None:
        """Assert that no block is held: call only when no sequence is live.

        Raises AssertionError naming what is wrong: a block with a reference, or
        free + cached != total.
        """
        held = [b for b, refs in enumerate(self._ref_counts) if refs]
        if held:
            raise AssertionError(f"blocks still referenced with no live sequence: {held[:20]}")
        if self.num_free_blocks != self.num_total_blocks:
            raise AssertionError(
                f"free ({len(self._free)}) + cached ({len(self._evictable)}) != total ({self.num_total_blocks})"
            )
        if len(self._cache) != len(self._evictable):
            raise AssertionError(f"{len(self._cache)} hashes for {len(self._evictable)} cached blocks")

    # ---- internals ------------------------------------------------------------------

    def _block_hash(self, seq: Sequence, index: int) -> bytes:
        """Hash of full block ``index`` of ``seq``, memoised in ``seq.block_hashes``."""
        hashes = seq.block_hashes
        while len(hashes) <= index:
            i = len(hashes)
            parent = hashes[-1] if hashes else _ROOT_HASH if seq.lora is None else seq.lora.prefix_key
            hashes.append(hash_block(parent, seq.token_ids[i * self.block_size : (i + 1) * self.block_size]))
        return hashes[index]

    def _match_blocks(self, seq: Sequence) -> list[int]:
        """Cached block ids of ``seq``'s longest cached prefix (see ``match_prefix``)."""
        if not self.enable_prefix_caching or seq.skip_prefix_cache or seq.block_table:
            return []
        hits: list[int] = []
        for index in range((seq.num_tokens - 1) // self.block_size):
            block_id = self._cache.get(self._block_hash(seq, index))
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _take_block(self) -> int:
        """A block for new content: a free one, else the least recently used cached one."""
        if self._free:
            block_id = self._free.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            del self._cache[self._hashes[block_id]]
            self._hashes[block_id] = None
        self._ref_counts[block_id] = 1
        return block_id

    def _acquire(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._evictable[block_id]
        self._ref_counts[block_id] += 1

    def _release(self, block_id: int) -> None:
        refs = self._ref_counts[block_id] - 1
        assert refs >= 0, f"block {block_id} freed more often than allocated"
        self._ref_counts[block_id] = refs
        if refs == 0:
            if self._hashes[block_id] is None:
                self._free.append(block_id)
            else:
                self._evictable[block_id] = None
