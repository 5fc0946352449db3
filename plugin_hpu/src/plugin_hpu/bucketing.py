"""Shape buckets for Gaudi, following vLLM's documented HPU bucketing rule.

Gaudi compiles one graph per input shape, so every batch is padded to a *bucket*.
Each bucketed dimension has a range ``(min, step, max)`` whose values are the SDK's
ramp-up ladder (:func:`plugins.buckets.ramp_up_range`) cut at ``max``::

    min=2, step=32, max=64    ->  2, 4, 8, 16, 32, 64
    min=128, step=128, max=512 ->  128, 256, 384, 512

Prompt buckets are pairs (batch size, sequence length), decode buckets pairs (batch
size, number of KV blocks of the whole batch). The twelve variables
``{PROMPT,DECODE}_{BS,SEQ,BLOCK}_BUCKET_{MIN,STEP,MAX}`` set the ranges; unset ones
take vLLM's defaults, derived from the engine config (see :func:`default_ranges`).
Everything here is pure Python.

Decode's second dimension counts KV blocks of the whole batch, as the guide's variable
table has it (``DECODE_BLOCK_BUCKET_*``); the guide's padding example and logs come
from an older vLLM that bucketed decode by the longest sequence's length ("seq").
The lookup is the same for both: the smallest bucket >= the value in each dimension.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plugins.buckets import ramp_up_range, smallest_at_least

Bucket = tuple[int, int]

#: (phase, dimension) pairs that have a range; BLOCK is decode's second dimension
DIMENSIONS = (("PROMPT", "BS"), ("PROMPT", "SEQ"), ("DECODE", "BS"), ("DECODE", "BLOCK"))
STRATEGIES = ("min_tokens", "max_bs")


@dataclass(frozen=True)
class BucketRange:
    """One dimension's bucket range ``(min, step, max)``; ``name`` is used in errors."""

    min: int
    step: int
    max: int
    name: str = "bucket"

    def __post_init__(self) -> None:
        if min(self.min, self.step, self.max) < 1:
            raise ValueError(f"{self.name} range {self.as_tuple()} must be positive integers")
        if self.min > self.max:
            raise ValueError(f"{self.name} min {self.min} is greater than its max {self.max}")

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.min, self.step, self.max)

    def values(self) -> list[int]:
        """The bucket values: ramp-up (``min`` doubling while below ``step``), then
        multiples of ``step`` up to ``max``; none below ``min`` or above ``max``."""
        return ramp_up_range(self.min, self.step, self.max)


def default_ranges(max_num_seqs: int, block_size: int, max_model_len: int) -> dict[str, tuple[int, int, int]]:
    """vLLM's defaults for the four ranges, keyed ``"PROMPT_BS"``, ``"PROMPT_SEQ"``, ...

    Decode's BLOCK range counts KV blocks of the whole batch; like vLLM it starts and
    steps at ``block_size`` and ends at ``max(128, max_num_seqs * max_model_len / block_size)``.
    """
    return {
        "PROMPT_BS": (1, min(max_num_seqs, 32), min(max_num_seqs, 64)),
        "PROMPT_SEQ": (block_size, block_size, max_model_len),
        "DECODE_BS": (1, min(max_num_seqs, 32), max_num_seqs),
        "DECODE_BLOCK": (block_size, block_size, max(128, max_num_seqs * max_model_len // block_size)),
    }


def read_ranges(env: Mapping[str, Any], defaults: Mapping[str, tuple[int, int, int]]) -> dict[str, BucketRange]:
    """Ranges from parsed env values ``{"PROMPT_BS_BUCKET_MIN": 4 or None, ...}`` over defaults."""
    ranges = {}
    for phase, dim in DIMENSIONS:
        key = f"{phase}_{dim}"
        parts = [
            default if env.get(f"{key}_BUCKET_{param}") is None else env[f"{key}_BUCKET_{param}"]
            for param, default in zip(("MIN", "STEP", "MAX"), defaults[key], strict=True)
        ]
        ranges[key] = BucketRange(*parts, name=f"{key}_BUCKET")
    return ranges


def prompt_buckets(bs: BucketRange, seq: BucketRange, max_num_batched_tokens: int | None = None) -> list[Bucket]:
    """Every (batch size, sequence length) pair, without those over the token budget.

    :raises ValueError: when the token budget leaves no bucket at all.
    """
    pairs = [(b, s) for b in bs.values() for s in seq.values()]
    if max_num_batched_tokens is None:
        return pairs
    kept = [(b, s) for b, s in pairs if b * s <= max_num_batched_tokens]
    if not kept:
        b, s = pairs[0]
        raise ValueError(
            f"no prompt bucket fits max_num_batched_tokens={max_num_batched_tokens}: the smallest is "
            f"({b}, {s}) = {b * s} tokens; raise --max-num-batched-tokens or lower PROMPT_SEQ_BUCKET_MIN"
        )
    return kept


def decode_buckets(bs: BucketRange, blocks: BucketRange, max_blocks: int | None = None) -> list[Bucket]:
    """Every (batch size, KV blocks) pair, without block counts over ``max_blocks``
    (the number of KV blocks allocated, when known)."""
    return [(b, n) for b in bs.values() for n in blocks.values() if max_blocks is None or n <= max_blocks]


def by_tokens(bucket: Bucket) -> tuple[int, int, int]:
    """Sort key: tokens (``batch size * second dimension``), then the second dimension."""
    return (bucket[0] * bucket[1], bucket[1], bucket[0])


def warmup_order(buckets: Iterable[Bucket]) -> list[Bucket]:
    """Warm-up (compilation) order: most tokens first, as the guide's log shows it
    (decode [47/48] is (2, 128), before (1, 128)), so the peak memory of the biggest
    shape is met while everything is still free."""
    return sorted(buckets, key=by_tokens, reverse=True)


def capture_order(buckets: Iterable[Bucket], strategy: str) -> list[Bucket]:
    """HPU-graph capture order for a strategy.

    ``max_bs``: batch size descending, then the second dimension ascending (decode's
    default: a loaded server decodes at its largest batch). ``min_tokens``: ascending
    ``batch size * second dimension``, ties by the second dimension (prompt's default:
    prefills usually run at batch size 1-4).
    """
    if strategy == "max_bs":
        return sorted(buckets, key=lambda b: (-b[0], b[1]))
    if strategy == "min_tokens":
        return sorted(buckets, key=by_tokens)
    raise ValueError(f"unknown graph capture strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


@dataclass(frozen=True)
class HpuBuckets:
    """The prompt and decode buckets of one engine config."""

    ranges: dict[str, BucketRange]
    prompt: list[Bucket]
    decode: list[Bucket]

    @classmethod
    def build(
        cls,
        env: Mapping[str, Any],
        *,
        max_num_seqs: int,
        block_size: int,
        max_model_len: int,
        max_num_batched_tokens: int | None = None,
        max_blocks: int | None = None,
    ) -> HpuBuckets:
        """Buckets from the parsed bucket variables over vLLM's defaults for the config."""
        ranges = read_ranges(env, default_ranges(max_num_seqs, block_size, max_model_len))
        return cls(
            ranges=ranges,
            prompt=prompt_buckets(ranges["PROMPT_BS"], ranges["PROMPT_SEQ"], max_num_batched_tokens),
            decode=decode_buckets(ranges["DECODE_BS"], ranges["DECODE_BLOCK"], max_blocks),
        )

    def _find(self, buckets: list[Bucket], first: int, second: int) -> Bucket | None:
        bucket = (
            smallest_at_least(first, sorted({b for b, _ in buckets})),
            smallest_at_least(second, sorted({s for _, s in buckets})),
        )
        return bucket if bucket in buckets else None

    def prompt_bucket(self, num_seqs: int, max_seq_len: int) -> Bucket | None:
        """The prompt bucket a batch pads to, or None when it exceeds every bucket
        (it then runs unpadded, compiling a graph for its shape)."""
        return self._find(self.prompt, num_seqs, max_seq_len)

    def decode_bucket(self, num_seqs: int, num_blocks: int) -> Bucket | None:
        """The decode bucket of ``num_seqs`` sequences holding ``num_blocks`` KV blocks."""
        return self._find(self.decode, num_seqs, num_blocks)

    def describe(self) -> str:
        """The four lines vLLM logs for the buckets (the guide's format), one per line."""
        return "\n".join(
            range_lines("Prompt", self.ranges["PROMPT_BS"], "seq", self.ranges["PROMPT_SEQ"], self.prompt)
            + range_lines("Decode", self.ranges["DECODE_BS"], "block", self.ranges["DECODE_BLOCK"], self.decode)
        )


def range_lines(phase: str, bs: BucketRange, dim: str, second: BucketRange, buckets: Sequence[Bucket]) -> list[str]:
    """``Prompt bucket config (min, step, max_warmup) bs:[1, 32, 4], seq:[...]`` and
    ``Generated 24 prompt buckets: [(1, 128), ...]``, as in the guide."""
    return [
        f"{phase} bucket config (min, step, max_warmup) bs:{list(bs.as_tuple())}, {dim}:{list(second.as_tuple())}",
        f"Generated {len(buckets)} {phase.lower()} buckets: {list(buckets)}",
    ]


def blocks_of(seq_lens: Iterable[int], block_size: int) -> int:
    """KV blocks the sequences of a decode batch occupy together."""
    return sum(math.ceil(s / block_size) for s in seq_lens)
