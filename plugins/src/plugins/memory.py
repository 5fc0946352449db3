"""Memory profiling and KV-cache planning.

The engine loads the weights, asks the platform's :class:`MemoryProfiler` to measure
a profile forward pass at the largest batch (unless the profiler says its budget does
not need one: :attr:`MemoryProfiler.needs_profile_run`), then to turn what is left into
a number of KV-cache blocks. The default here works for any host-memory device: it budgets a
fixed number of bytes (``kv_cache_bytes`` of the engine config, else a quarter of
the available host memory, at most 4 GiB). Accelerators override
:meth:`MemoryProfiler.kv_cache_budget` with their own accounting.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30


def host_memory() -> tuple[int, int]:
    """``(total, available)`` bytes of host memory, from ``/proc/meminfo`` or sysconf."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        return info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    except (OSError, KeyError, ValueError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


@dataclass(frozen=True)
class KVCachePlan:
    """How many KV blocks to allocate, and the reasoning a user can check in the log."""

    num_blocks: int
    budget_bytes: int
    block_bytes: int
    detail: str


class MemoryProfiler:
    """Reports device memory and sizes the KV cache. Override for device memory APIs."""

    #: Whether the KV budget needs the activation peak of a profile forward pass at the
    #: largest batch: the engine runs that pass (through :meth:`measure_peak`) only when
    #: True, and passes a peak of 0 otherwise. A host-memory profiler whose budget is a
    #: fixed size or a share of free memory that leaves room for the activations may say
    #: False: on a CPU that pass is the longest part of start-up (~8 s for 2048 tokens of
    #: a 135M model on 2 cores).
    needs_profile_run: bool = True

    def __init__(self, platform: Any) -> None:
        self.platform = platform

    def total_memory(self) -> int:
        """Bytes of memory of the device (default: host memory)."""
        return host_memory()[0]

    def free_memory(self) -> int:
        """Bytes currently free on the device (default: available host memory)."""
        return host_memory()[1]

    def measure_peak(self, profile_fn: Callable[[], None]) -> int:
        """Run ``profile_fn`` and return the peak extra bytes it needed (>= 0).

        The default reads the process's peak resident set before and after, which
        only grows, so it reports 0 when the profile fits in memory already touched.
        """
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        profile_fn()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(0, after - before)

    def kv_cache_budget(self, config: Any, peak_activation_bytes: int) -> tuple[int, str]:
        """Return ``(bytes for the KV cache, how that number was chosen)``.

        ``config.kv_cache_bytes`` (set by the user) wins; otherwise a quarter of the
        free memory, capped at 4 GiB.
        """
        requested = getattr(config, "kv_cache_bytes", None)
        if requested:
            return int(requested), f"{requested / GiB:.2f} GiB requested"
        free = self.free_memory() - peak_activation_bytes
        budget = max(0, min(4 * GiB, free // 4))
        return budget, f"min(4 GiB, 25% of {free / GiB:.1f} GiB free after activations)"

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """One layer's K or V cache ``[num_blocks, block_size, kv_heads, head_size]``.

        The default zeroes it. A platform whose attention reads only the slots written
        before (positions below each sequence's length) may return it uninitialized: on
        the host its pages are then faulted in as the cache fills, not all at start-up.
        """
        import torch

        return torch.zeros(shape, dtype=dtype, device=device)

    def plan_kv_cache(self, config: Any, block_bytes: int, peak_activation_bytes: int = 0) -> KVCachePlan:
        """Turn the budget into whole blocks of ``block_bytes`` (all layers, K and V)."""
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be positive, got {block_bytes}")
        budget, why = self.kv_cache_budget(config, peak_activation_bytes)
        num_blocks = budget // block_bytes
        detail = f"KV cache {budget / GiB:.2f} GiB ({why}) = {num_blocks} blocks of {block_bytes / (1 << 20):.2f} MiB"
        return KVCachePlan(num_blocks=num_blocks, budget_bytes=budget, block_bytes=block_bytes, detail=detail)
