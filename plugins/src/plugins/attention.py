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

from dataclasses import dataclass

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
        starts = [0]
        slots: list[int] = []
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            if not 0 < q_len <= s_len:
                raise ValueError(f"query_len {q_len} must be in [1, seq_len={s_len}]")
            starts.append(starts[-1] + q_len)
            for pos in range(s_len - q_len, s_len):
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        width = max((len(t) for t in block_tables), default=0) or 1
        tables = [t + [0] * (width - len(t)) for t in block_tables]
        return cls(
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device).reshape(len(tables), width),
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            query_lens_host=list(query_lens),
            seq_lens_host=list(seq_lens),
        )
