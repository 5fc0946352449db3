"""Sequence-length buckets for ahead-of-time Neuron compilation (pure functions).

The Neuron compiler builds one graph per context-encoding length and per
token-generation length before serving; a batch is padded to the smallest bucket
that holds it. NxD Inference's automatic bucketing, which vLLM's Neuron backend turns
on with ``max_context_length = seq_len = max_model_len``: "Context encoding: powers
of two between 128 and the max context length. Token generation: powers of two
between 128 and the maximum sequence length", the maximum itself always the last
bucket. A power of two within a factor sqrt(2) of the maximum is left out (NxD
Inference rounds ``log2(max)``), so there is no ``[128, 256, 512, 513]``.
``NEURON_CONTEXT_LENGTH_BUCKETS`` / ``NEURON_TOKEN_GEN_BUCKETS`` (vLLM's names, e.g.
``128,512,1024,2048``) replace the lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from plugins.buckets import pad_size, rungs

MIN_BUCKET = 128


def default_buckets(max_len: int, min_len: int = MIN_BUCKET) -> list[int]:
    """Powers of two from ``min_len`` (doubling) below ``max_len / sqrt(2)``, then ``max_len``."""
    if max_len < 1:
        raise ValueError(f"max_model_len must be positive, got {max_len}")
    sizes = []
    for size in rungs(min_len, None):
        if 2 * size * size >= max_len * max_len:  # size >= max_len / sqrt(2), in integers
            break
        sizes.append(size)
    return sizes + [max_len]


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


@dataclass(frozen=True)
class NeuronShapes:
    """The compiled shapes: context encoding runs one sequence at a time (vLLM's
    ``ctx_batch_size=1``) at a context bucket; token generation runs ``batch_size``
    (``max_num_seqs``) sequences at the token-generation bucket of the longest one."""

    context: list[int]
    token_gen: list[int]
    batch_size: int

    def context_shape(self, prompt_len: int) -> tuple[int, int]:
        """``(1, bucket)`` a prompt of ``prompt_len`` tokens is right-padded to."""
        return 1, select_bucket(prompt_len, self.context)

    def token_gen_shape(self, seq_lens: Sequence[int]) -> tuple[int, int]:
        """``(batch_size, bucket)`` of a decode batch whose sequences hold ``seq_lens`` tokens.

        :raises ValueError: more sequences than the compiled batch size, or too long.
        """
        if len(seq_lens) > self.batch_size:
            raise ValueError(f"{len(seq_lens)} sequences exceed the compiled batch size {self.batch_size}")
        return self.batch_size, select_bucket(max(seq_lens), self.token_gen)

    def graphs(self) -> list[tuple[str, int, int]]:
        """Every graph compiled ahead of time: ``(phase, batch size, length)``."""
        return [("context", 1, n) for n in self.context] + [("token_gen", self.batch_size, n) for n in self.token_gen]
