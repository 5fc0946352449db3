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

from plugin_hpu.bucketing import Bucket


def format_bytes(size: float) -> str:
    """Bytes as vLLM's Gaudi logs print them: 4 significant digits and a binary unit
    (``15.85 GiB``, ``7.923 GiB``, ``161.9 MiB``, ``0 B``)."""
    power = 0
    while abs(size) > 1024 and power < 4:
        size /= 1024
        power += 1
    return f"{size:.4g} {('', 'Ki', 'Mi', 'Gi', 'Ti')[power]}B"


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
        """The guide's ``Free device memory: ...`` log line."""
        return (
            f"Free device memory: {format_bytes(self.free_bytes)}, {format_bytes(self.usable_bytes)} usable "
            f"(gpu_memory_utilization={gpu_memory_utilization}), {format_bytes(self.graph_bytes)} reserved "
            f"for HPUGraphs (VLLM_GRAPH_RESERVED_MEM={graph_reserved_mem}), "
            f"{format_bytes(self.kv_cache_bytes)} reserved for KV cache"
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


def describe_split(total: int, free_now: int, prompt: int, decode: int, prompt_ratio: float) -> str:
    """The guide's ``Using ... of free device memory for HPUGraphs`` log line."""
    return (
        f"Using {format_bytes(total)}/{format_bytes(free_now)} of free device memory for HPUGraphs, "
        f"{format_bytes(prompt)} for prompt and {format_bytes(decode)} for decode "
        f"(VLLM_GRAPH_PROMPT_RATIO={prompt_ratio})"
    )


@dataclass
class CaptureResult:
    """Graphs of one phase captured so far and what they cost."""

    captured: list[Bucket] = field(default_factory=list)
    used_bytes: int = 0
    units: int = 0  # tokens (prompt) or sequences (decode) the captured graphs cover
    captured_all: bool = False
    #: ``(position in the capture order, 1-based, bucket)`` of each graph, in capture order
    log: list[tuple[int, Bucket]] = field(default_factory=list)

    def describe(self, phase: str, num_buckets: int) -> str:
        """The guide's ``Graph/Prompt captured:15 (62.5%) used_mem:14.03 GiB buckets:[...]``."""
        share = 100 * len(self.captured) / num_buckets if num_buckets else 100.0
        return (
            f"Graph/{phase} captured:{len(self.captured)} ({share:.1f}%) used_mem:{format_bytes(self.used_bytes)} "
            f"buckets:{sorted(self.captured)}"
        )


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
    so far (the first one is always tried); one whose estimate is not below what is
    left is skipped, and a smaller one later in the order may still be captured.

    :param capture: captures one bucket's graph and returns the device bytes it took.
    :param prior: the phase's earlier result, to continue with its graphs and costs.
    """
    result = CaptureResult(
        captured=list(prior.captured) if prior else [],
        used_bytes=prior.used_bytes if prior else 0,
        units=prior.units if prior else 0,
        captured_all=True,
        log=list(prior.log) if prior else [],
    )
    remaining = budget
    done = set(result.captured)
    for position, bucket in enumerate(ordered, 1):
        units = graph_units(bucket, is_prompt)
        estimate = units * result.used_bytes / result.units if result.units else 0
        if estimate >= remaining:
            result.captured_all = False
            continue
        if bucket in done:
            continue
        used = capture(bucket, is_prompt)
        remaining -= used
        result.used_bytes += used
        result.units += units
        result.captured.append(bucket)
        result.log.append((position, bucket))
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
