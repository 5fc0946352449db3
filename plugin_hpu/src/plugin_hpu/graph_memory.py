"""HPU-graph memory budgeting, as vLLM documents it for Gaudi (pure functions).

After the weights are loaded and a profile run is done, ``free`` bytes remain.
``usable = free * gpu_memory_utilization``; of that, ``GRAPH_RESERVED_MEM`` is kept
for HPU graphs and the rest goes to the KV cache. The remainder ``free - usable`` is
a margin that is never used. When graphs are captured (after the KV cache is
allocated and the buckets are warmed up), the graph memory is whatever is free above
that margin, split ``GRAPH_PROMPT_RATIO`` for prompt graphs and the rest for decode.
Capture follows each phase's strategy order and skips a graph whose estimated size
does not fit; a phase that captured everything hands what it left to the other one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from plugins.memory import GiB

from plugin_hpu.bucketing import Bucket


@dataclass(frozen=True)
class MemoryPlan:
    """How the free device memory after profiling is divided."""

    free_bytes: int
    usable_bytes: int
    graph_bytes: int
    kv_cache_bytes: int

    @property
    def margin_bytes(self) -> int:
        """Memory kept free throughout (``free - usable``)."""
        return self.free_bytes - self.usable_bytes

    def describe(self, gpu_memory_utilization: float, graph_reserved_mem: float) -> str:
        return (
            f"Free device memory: {self.free_bytes / GiB:.4g} GiB, {self.usable_bytes / GiB:.4g} GiB usable "
            f"(gpu_memory_utilization={gpu_memory_utilization}), {self.graph_bytes / GiB:.4g} GiB reserved "
            f"for HPUGraphs (GRAPH_RESERVED_MEM={graph_reserved_mem}), "
            f"{self.kv_cache_bytes / GiB:.4g} GiB reserved for KV cache"
        )


def plan_memory(
    free_bytes: int, gpu_memory_utilization: float, graph_reserved_mem: float, enforce_eager: bool = False
) -> MemoryPlan:
    """Split free memory after profiling into graph reserve, KV cache and margin.

    With ``enforce_eager`` no graphs are captured, so nothing is reserved for them.
    """
    for name, value in (("gpu_memory_utilization", gpu_memory_utilization), ("GRAPH_RESERVED_MEM", graph_reserved_mem)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    usable = int(max(0, free_bytes) * gpu_memory_utilization)
    graph = 0 if enforce_eager else int(usable * graph_reserved_mem)
    return MemoryPlan(free_bytes=free_bytes, usable_bytes=usable, graph_bytes=graph, kv_cache_bytes=usable - graph)


def split_graph_memory(free_now: int, margin_bytes: int, prompt_ratio: float) -> tuple[int, int, int]:
    """``(graph memory, prompt share, decode share)`` at capture time.

    :param free_now: free device memory just before capture.
    :param margin_bytes: :attr:`MemoryPlan.margin_bytes`, never to be used.
    """
    if not 0 <= prompt_ratio <= 1:
        raise ValueError(f"GRAPH_PROMPT_RATIO must be in [0, 1], got {prompt_ratio}")
    total = max(0, free_now - margin_bytes)
    prompt = int(total * prompt_ratio)
    return total, prompt, total - prompt


@dataclass
class CaptureResult:
    """Graphs of one phase captured so far and what they cost."""

    captured: list[Bucket] = field(default_factory=list)
    used_bytes: int = 0
    units: int = 0  # tokens (prompt) or sequences (decode) the captured graphs cover
    captured_all: bool = False


def graph_units(bucket: Bucket, is_prompt: bool) -> int:
    """What a graph's size grows with: tokens for a prompt graph, sequences for decode."""
    return bucket[0] * bucket[1] if is_prompt else bucket[0]


def capture_within_budget(
    ordered: Sequence[Bucket],
    budget: int,
    capture: Callable[[Bucket, bool], int],
    is_prompt: bool,
    prior: CaptureResult | None = None,
) -> CaptureResult:
    """Capture graphs in ``ordered`` order while their estimated size fits ``budget``.

    A graph's size is estimated from the average cost per unit of the graphs captured
    so far (the first one is always tried); one that does not fit is skipped and a
    smaller one later in the order may still be captured.

    :param capture: captures one bucket's graph and returns the device bytes it took.
    :param prior: the phase's earlier result, to continue with its graphs and costs.
    """
    result = CaptureResult(
        captured=list(prior.captured) if prior else [],
        used_bytes=prior.used_bytes if prior else 0,
        units=prior.units if prior else 0,
        captured_all=True,
    )
    remaining = budget
    done = set(result.captured)
    for bucket in ordered:
        if bucket in done:
            continue
        units = graph_units(bucket, is_prompt)
        estimate = units * result.used_bytes / result.units if result.units else 0
        if estimate >= remaining or remaining <= 0:
            result.captured_all = False
            continue
        used = capture(bucket, is_prompt)
        remaining -= used
        result.used_bytes += used
        result.units += units
        result.captured.append(bucket)
    return result


def capture_graphs(
    prompt_order: Sequence[Bucket],
    decode_order: Sequence[Bucket],
    graph_bytes: int,
    prompt_ratio: float,
    capture: Callable[[Bucket, bool], int],
) -> tuple[CaptureResult, CaptureResult]:
    """Capture prompt then decode graphs in their shares of ``graph_bytes``; memory a
    fully captured phase leaves goes to the other phase's remaining graphs."""
    prompt_budget = int(graph_bytes * prompt_ratio)
    prompt = capture_within_budget(prompt_order, prompt_budget, capture, True)
    decode = capture_within_budget(decode_order, graph_bytes - prompt_budget, capture, False)
    left = graph_bytes - prompt.used_bytes - decode.used_bytes
    if left > 0 and decode.captured_all and not prompt.captured_all:
        prompt = capture_within_budget(prompt_order, left, capture, True, prior=prompt)
    elif left > 0 and prompt.captured_all and not decode.captured_all:
        decode = capture_within_budget(decode_order, left, capture, False, prior=decode)
    return prompt, decode
