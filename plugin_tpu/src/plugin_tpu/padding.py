"""Static shapes for XLA: the padded sizes a batch is rounded up to (pure functions).

XLA compiles one graph per input shape, so, like vLLM's TPU backend, the number of
tokens is padded to powers of two from 16 (or, with a padding gap, powers of two below
the gap and then multiples of it: :func:`plugins.buckets.ramp_up_range`) and the number of sequences to powers of two
from 8 up to ``max_num_seqs``. Each size compiles once; the compiled graphs are
cached on disk under ``XLA_CACHE_PATH``.
"""

from __future__ import annotations

from plugins.buckets import pad_size, ramp_up_range

MIN_TOKENS = 16
MIN_SEQS = 8


def token_paddings(max_tokens: int, min_tokens: int = MIN_TOKENS, padding_gap: int = 0) -> list[int]:
    """Padded token counts, ascending; the last one is the first >= ``max_tokens``.

    :param padding_gap: 0 for powers of two throughout; else powers of two below the
        gap, then multiples of ``padding_gap`` (fewer graphs wasted on large batches).
    """
    if min(max_tokens, min_tokens) < 1 or padding_gap < 0:
        raise ValueError(f"need positive sizes and a gap >= 0, got max={max_tokens} min={min_tokens} gap={padding_gap}")
    return ramp_up_range(min_tokens, padding_gap or None, max_tokens, end="cover")


def seq_paddings(max_num_seqs: int, min_seqs: int = MIN_SEQS) -> list[int]:
    """Padded sequence counts: powers of two from ``min(min_seqs, max_num_seqs)``,
    ending exactly at ``max_num_seqs``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be positive, got {max_num_seqs}")
    return ramp_up_range(min(min_seqs, max_num_seqs), None, max_num_seqs, end="max")


def padded_size(value: int, paddings: list[int]) -> int:
    """The smallest padding >= ``value``.

    :raises ValueError: when ``value`` exceeds the largest padding.
    """
    return pad_size(value, paddings, "padded size")
