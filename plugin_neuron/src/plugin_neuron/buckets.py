"""Sequence-length buckets for ahead-of-time Neuron compilation (pure functions).

The Neuron compiler builds one graph per context-encoding length and per
token-generation length, before serving. vLLM reads the lists from
``NEURON_CONTEXT_LENGTH_BUCKETS`` and ``NEURON_TOKEN_GEN_BUCKETS``; unset, the lengths
are powers of two from 128 up to ``max_model_len``, which is always the last bucket.
"""

from __future__ import annotations

from collections.abc import Sequence

from plugins.buckets import pad_size, ramp_up_range

MIN_BUCKET = 128


def default_buckets(max_model_len: int, min_len: int = MIN_BUCKET) -> list[int]:
    """Powers of two from ``min_len`` below ``max_model_len``, then ``max_model_len``."""
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be positive, got {max_model_len}")
    return ramp_up_range(min_len, None, max_model_len, end="max")


def check_buckets(buckets: Sequence[int], max_model_len: int, name: str) -> list[int]:
    """Validate a user's bucket list: positive, strictly ascending, reaching ``max_model_len``.

    :param name: the variable the list came from, for the error message.
    :raises ValueError: naming the variable and what is wrong.
    """
    values = list(buckets)
    if not values or min(values) < 1:
        raise ValueError(f"{name}={values} must list positive lengths")
    if any(b >= a for a, b in zip(values[1:], values[:-1], strict=True)):
        raise ValueError(f"{name}={values} must be strictly ascending")
    if values[-1] < max_model_len:
        raise ValueError(f"{name}={values} ends below max_model_len={max_model_len}: add {max_model_len}")
    return values


def select_bucket(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= ``length``.

    :raises ValueError: when ``length`` exceeds every bucket.
    """
    return pad_size(length, buckets, "compiled bucket")
