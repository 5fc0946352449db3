"""Benchmark arithmetic: random prompts, percentiles, per-level serving summaries."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field


def random_prompts(
    num_prompts: int, input_len: int, vocab_size: int, seed: int, exclude: Sequence[int] = ()
) -> list[list[int]]:
    """``num_prompts`` lists of ``input_len`` token ids drawn uniformly from ``[0, vocab_size)``.

    Ids in ``exclude`` (special tokens) are never drawn. The same arguments give the same prompts.
    """
    if num_prompts < 1 or input_len < 1:
        raise ValueError(f"num_prompts and input_len must be positive, got {num_prompts} and {input_len}")
    banned = set(exclude)
    pool = [i for i in range(vocab_size) if i not in banned]
    if not pool:
        raise ValueError(f"no token ids left to draw from: vocab_size={vocab_size}, {len(banned)} excluded")
    rng = random.Random(seed)
    return [[rng.choice(pool) for _ in range(input_len)] for _ in range(num_prompts)]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default); NaN if empty."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RequestRecord:
    """What one streamed request measured. Times in seconds."""

    ttft: float | None = None  # first content chunk minus request start
    itls: list[float] = field(default_factory=list)  # gaps between later content chunks
    latency: float = 0.0  # request start to end of stream
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None


@dataclass
class LevelResult:
    """The summary of one concurrency level of ``core bench serve``. Times in milliseconds."""

    concurrency: int
    num_requests: int
    num_failed: int
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    output_tok_s: float
    total_tok_s: float
    request_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    latency_ms: dict[str, float]
    errors: list[str]


def summarize_level(concurrency: int, records: Sequence[RequestRecord], duration_s: float) -> LevelResult:
    """Aggregate a level's request records over its wall-clock ``duration_s``."""
    ok = [r for r in records if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    itls = [gap * 1000 for r in ok for gap in r.itls]
    latencies = [r.latency * 1000 for r in ok]
    rate = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: math.nan)
    return LevelResult(
        concurrency=concurrency,
        num_requests=len(records),
        num_failed=len(records) - len(ok),
        duration_s=duration_s,
        output_tokens=out_tokens,
        prompt_tokens=in_tokens,
        output_tok_s=rate(out_tokens),
        total_tok_s=rate(out_tokens + in_tokens),
        request_s=rate(len(ok)),
        ttft_ms={f"p{q}": percentile(ttfts, q) for q in (50, 90, 99)} | {"mean": _mean(ttfts)},
        itl_ms={f"p{q}": percentile(itls, q) for q in (50, 90, 99)} | {"mean": _mean(itls)},
        latency_ms={f"p{q}": percentile(latencies, q) for q in (50, 99)},
        errors=sorted({r.error for r in records if r.error is not None}),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
