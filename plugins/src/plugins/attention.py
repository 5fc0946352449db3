"""The batch layout every attention kernel receives.

A step's batch is flattened: the new tokens of all sequences are concatenated into
one ``[num_tokens, ...]`` tensor (prefill chunks and single decode tokens mixed),
sequence ``i`` owning rows ``query_start_loc[i]:query_start_loc[i + 1]``. Its new
tokens are the last ``query_len`` positions of its ``seq_len`` context, so attention
is causal with an offset of ``seq_len - query_len``.

The KV cache of one layer is a pair of tensors ``[num_blocks, block_size,
num_kv_heads, head_size]``; ``block_tables[i, j]`` is the cache block that holds
tokens ``j * block_size ... (j + 1) * block_size - 1`` of sequence ``i``. A one-byte
(FP8 E4M3) cache adds the layer's ``kv_scale`` as a third element (:mod:`plugins.kv_cache`).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat

import torch


@dataclass
class AttentionMetadata:
    """Where each sequence's queries and cached keys/values are.

    Tensors live on the platform's device; the ``*_host`` lists are the same numbers
    on the host, so that kernels and runners can plan without a device sync.
    """

    query_start_loc: torch.Tensor  # int32 [num_seqs + 1], prefix sums of query lengths
    seq_lens: torch.Tensor  # int32 [num_seqs], context length including this step's tokens
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq], padded with 0
    slot_mapping: torch.Tensor  # int64 [num_tokens], cache slot of each new token; -1 = skip
    query_lens_host: list[int]
    seq_lens_host: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_host, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens_host)

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        seq_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> AttentionMetadata:
        """Build the metadata of a batch from per-sequence lengths and block tables."""
        meta, _ = build_step(query_lens, seq_lens, block_tables, block_size, [], lambda host: host.to(device))
        return meta


def build_step(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    token_rows: Sequence[Sequence[int]],
    stage: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[AttentionMetadata, list[torch.Tensor]]:
    """One step's metadata and int64 per-token rows (``token_rows``: input ids, positions) moved
    to the device in one copy: everything is packed into one host byte buffer, ``stage`` moves it
    (``Runner.stage``: a pinned, asynchronous copy on a GPU) and the tensors are views into the
    result, so a step costs one host-to-device copy and no synchronisation.

    :raises ValueError: a query length outside ``[1, seq_len]``, a block table too short for its
        sequence, or a token row whose length is not the batch's token count.
    """
    num_seqs = len(seq_lens)
    if len(query_lens) != num_seqs or len(block_tables) != num_seqs:
        raise ValueError(
            f"{len(query_lens)} query lengths, {num_seqs} seq lengths and {len(block_tables)} block tables"
        )
    num_tokens = sum(query_lens)
    if any(len(row) != num_tokens for row in token_rows):
        raise ValueError(f"token rows of {[len(r) for r in token_rows]} for a batch of {num_tokens} tokens")
    i64 = array("q")  # token rows, then slots; C arrays: a list comprehension per token is slower
    for row in token_rows:
        i64.extend(row)
    for i, (q_len, s_len, table) in enumerate(zip(query_lens, seq_lens, block_tables)):  # noqa: B905
        if not 0 < q_len <= s_len:
            raise ValueError(f"query_len {q_len} must be in [1, seq_len={s_len}]")
        if len(table) * block_size < s_len:
            raise ValueError(
                f"sequence {i}: a block table of {len(table)} blocks of {block_size} cannot hold {s_len} tokens"
            )
        pos = s_len - q_len
        while pos < s_len:  # one run of slots per block the new tokens touch
            block, end = pos // block_size, min(s_len, (pos // block_size + 1) * block_size)
            shift = (table[block] - block) * block_size
            i64.extend(range(shift + pos, shift + end))
            pos = end
    width = max(map(len, block_tables), default=0) or 1
    i32 = array("i", accumulate(query_lens, initial=0))
    i32.extend(seq_lens)
    for table in block_tables:
        i32.extend(table)
        i32.extend(repeat(0, width - len(table)))
    n64 = len(i64)
    buf = bytearray(i64.tobytes() + i32.tobytes())
    dev = stage(torch.frombuffer(buf, dtype=torch.uint8))
    d64, d32 = dev[: 8 * n64].view(torch.int64), dev[8 * n64 :].view(torch.int32)
    meta = AttentionMetadata(
        query_start_loc=d32[: num_seqs + 1],
        seq_lens=d32[num_seqs + 1 : 2 * num_seqs + 1],
        block_tables=d32[2 * num_seqs + 1 :].view(num_seqs, width),
        slot_mapping=d64[len(token_rows) * num_tokens :],
        query_lens_host=list(query_lens),
        seq_lens_host=list(seq_lens),
    )
    return meta, [d64[k * num_tokens : (k + 1) * num_tokens] for k in range(len(token_rows))]
