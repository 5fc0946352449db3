"""KV-cache budgeting for the CPU: CPU_KVCACHE_SPACE GiB, or a share of free memory."""

from __future__ import annotations

import logging
from typing import Any

from plugins.memory import GiB, MemoryProfiler

logger = logging.getLogger(__name__)

#: with CPU_KVCACHE_SPACE=0 (auto): this share of the memory free after the weights (the
#: rest is room for activations, a few hundred MB at 2048 tokens for models a CPU serves) ...
AUTO_FRACTION = 0.4
#: ... capped at this many bytes (a small model seldom needs more)
AUTO_CAP = 8 * GiB


class CpuMemoryProfiler(MemoryProfiler):
    """Host-memory profiler whose KV budget follows ``CPU_KVCACHE_SPACE`` (as vLLM's).

    Like vLLM's CPU backend it sizes the cache without a profile forward pass: the budget
    is a fixed size or a share of free memory, and that pass (a 2048-token forward) was
    half of the engine's start-up on this platform.
    """

    needs_profile_run = False

    def kv_cache_budget(self, config: Any, peak_activation_bytes: int) -> tuple[int, str]:
        space = self.platform.env["CPU_KVCACHE_SPACE"]
        free = self.free_memory() - peak_activation_bytes
        if space > 0:
            budget = int(space * GiB)
            if budget > free:
                raise ValueError(
                    f"CPU_KVCACHE_SPACE={space} GiB exceeds the {free / GiB:.1f} GiB of memory free "
                    "after the weights; lower it"
                )
            why = f"CPU_KVCACHE_SPACE={space} GiB"
        elif getattr(config, "kv_cache_bytes", None):
            budget = int(config.kv_cache_bytes)
            why = f"{budget / GiB:.2f} GiB requested by the engine config"
        else:
            budget = max(0, min(AUTO_CAP, int(free * AUTO_FRACTION)))
            why = (
                f"auto: min({AUTO_CAP / GiB:.0f} GiB, {AUTO_FRACTION:.0%} of {free / GiB:.1f} GiB free); "
                "set CORE_CPU_KVCACHE_SPACE to choose"
            )
        logger.info("cpu_x86 KV cache budget %.2f GiB (%s)", budget / GiB, why)
        return budget, why

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """Uninitialized: the native and reference attention read only slots written before,
        and zeroing the default 8 GiB took 10-17 s of start-up (and all of it resident at once)."""
        import torch

        return torch.empty(shape, dtype=dtype, device=device)
