"""GPU memory accounting and KV-cache sizing.

KV bytes = total * utilization - weights - non-torch memory - activation peak -
CUDA-graph reserve, where the utilization is ``GPU_MEMORY_UTILIZATION`` (when set) or
the engine's ``gpu_memory_utilization``. Memory other processes hold on the device
counts as non-torch memory, so the plan never takes more than is free. All CUDA
calls go through one object (``torch.cuda`` by default) so tests can fake it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugins.memory import MemoryProfiler

logger = logging.getLogger(__name__)

GiB = 1 << 30


@dataclass(frozen=True)
class MemoryBreakdown:
    """What a GPU's memory is spent on before the KV cache (bytes)."""

    total: int
    utilization: float
    weights: int
    non_torch: int
    activations: int
    graphs: int

    @property
    def kv_cache(self) -> int:
        """What is left for the KV cache (0 when the rest does not fit)."""
        return max(
            0, int(self.total * self.utilization) - self.weights - self.non_torch - self.activations - self.graphs
        )

    def describe(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GiB:.2f} GiB"

        text = (
            f"{self.utilization:g} x {gib(self.total)} total - weights {gib(self.weights)} - "
            f"non-torch {gib(self.non_torch)} - activation peak {gib(self.activations)} - "
            f"CUDA graphs {gib(self.graphs)}"
        )
        if self.kv_cache == 0:
            text += (
                " leaves nothing for the KV cache: raise GPU_MEMORY_UTILIZATION or lower max_num_seqs / max_model_len"
            )
        return text


class CudaMemoryProfiler(MemoryProfiler):
    """Sizes the KV cache from ``torch.cuda`` memory statistics.

    :param cuda: the object the CUDA memory calls go to (default ``torch.cuda``).
    """

    def __init__(self, platform: Any, cuda: Any = None) -> None:
        super().__init__(platform)
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.cuda = cuda
        self.weights_bytes: int | None = None  # allocated before the profile forward

    def total_memory(self) -> int:
        return self.cuda.mem_get_info()[1]

    def free_memory(self) -> int:
        return self.cuda.mem_get_info()[0]

    def measure_peak(self, profile_fn: Callable[[], None]) -> int:
        """Peak bytes the profile forward allocates beyond what was allocated before it."""
        self.cuda.synchronize()
        self.cuda.reset_peak_memory_stats()
        self.weights_bytes = self.cuda.memory_allocated()
        profile_fn()
        self.cuda.synchronize()
        peak = max(0, self.cuda.max_memory_allocated() - self.weights_bytes)
        self.cuda.empty_cache()  # the profile's cached blocks go back to the driver, for the KV cache
        logger.info("cuda: profile forward peaked at %.2f GiB of activations", peak / GiB)
        return peak

    def utilization(self, config: Any) -> tuple[float, str]:
        """The fraction of memory to plan for and where it came from."""
        var = next(v for v in self.platform.env_vars if v.name == "GPU_MEMORY_UTILIZATION")
        raw = var.raw(os.environ)
        if raw is not None:
            return self.platform.env["GPU_MEMORY_UTILIZATION"], raw[0]
        from_config = getattr(config, "gpu_memory_utilization", None)
        if from_config is not None:
            return float(from_config), "gpu_memory_utilization"
        return var.default, f"{var.env_name} default"

    def breakdown(self, config: Any, peak_activation_bytes: int) -> MemoryBreakdown:
        """Read the device's memory now and account for everything but the KV cache."""
        free, total = self.cuda.mem_get_info()
        non_torch = max(0, total - free - self.cuda.memory_reserved())
        weights = self.weights_bytes if self.weights_bytes is not None else self.cuda.memory_allocated()
        graphs, graph_why = self.platform.runner.graph_memory_reserve(config, peak_activation_bytes)
        logger.info("cuda: reserving %.2f GiB for CUDA graphs (%s)", graphs / GiB, graph_why)
        util, _ = self.utilization(config)
        return MemoryBreakdown(total, util, weights, non_torch, peak_activation_bytes, graphs)

    def kv_cache_budget(self, config: Any, peak_activation_bytes: int) -> tuple[int, str]:
        """``(KV bytes, the breakdown)``; ``config.kv_cache_bytes``, when set, wins."""
        requested = getattr(config, "kv_cache_bytes", None)
        if requested:
            return int(requested), f"{requested / GiB:.2f} GiB requested"
        plan = self.breakdown(config, peak_activation_bytes)
        util, source = self.utilization(config)
        return plan.kv_cache, f"{plan.describe()}; utilization from {source}"
