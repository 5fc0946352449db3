"""How split-K (flash-decoding) decode attention divides each sequence's context.

Pure arithmetic on host numbers only, so a CUDA graph captured with worst-case host
lengths gets a grid that is valid for every later replay.
"""

from __future__ import annotations

from dataclasses import dataclass

#: never split a context into more parts than this (bounds the reduce step's width)
MAX_SPLITS = 32


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class DecodeSplits:
    """``num_splits`` parts of ``tokens_per_split`` context tokens each (the last may be short)."""

    num_splits: int
    tokens_per_split: int


def plan_decode_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, min_split_tokens: int, block_n: int
) -> DecodeSplits:
    """Choose the split of decode attention for a batch.

    Splits only when ``num_seqs * num_kv_heads`` programs leave the GPU's
    ``num_sms`` multiprocessors under-used: then the context is cut so that there are
    about two programs per multiprocessor, no split shorter than ``min_split_tokens``
    and at most :data:`MAX_SPLITS` splits. ``tokens_per_split`` is a multiple of
    ``block_n`` (the kernel's tile).
    """
    if min(num_seqs, num_kv_heads, num_sms, min_split_tokens, block_n) <= 0:
        raise ValueError(
            f"plan_decode_splits needs positive sizes, got num_seqs={num_seqs}, num_kv_heads={num_kv_heads}, "
            f"num_sms={num_sms}, min_split_tokens={min_split_tokens}, block_n={block_n}"
        )
    max_seq_len = max(max_seq_len, 1)
    wanted = max(1, min(MAX_SPLITS, cdiv(2 * num_sms, num_seqs * num_kv_heads)))
    tokens = max(min_split_tokens, cdiv(max_seq_len, wanted))
    tokens = cdiv(tokens, block_n) * block_n
    return DecodeSplits(num_splits=cdiv(max_seq_len, tokens), tokens_per_split=tokens)
